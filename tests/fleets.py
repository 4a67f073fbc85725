"""A test's own fleet: a resources.yaml in a config folder of the test's, TRAINYARD_CONFIG_DIR and
TRAINYARD_HOME pointing at the test's folders, and the admission ledger over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def local_fleet(tmp_path: Path, monkeypatch: Any, resources_yaml: str) -> Any:
    """The ledger of a fleet that ``resources_yaml`` describes, with this test's config folder and home."""
    from trainyard.scheduling.admission.ledger import default_ledger

    config = tmp_path / "config"
    config.mkdir()
    (config / "resources.yaml").write_text(resources_yaml)
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    return default_ledger()
