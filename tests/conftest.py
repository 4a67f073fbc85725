import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))


@pytest.fixture
def trainyard_home(tmp_path, monkeypatch):
    """A fresh TRAINYARD_HOME (store, cache, runs, MLflow) per test."""
    home = tmp_path / "trainyard"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home
