"""Where trainyard keeps its state. Everything derives from TRAINYARD_HOME (default: ./var)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TRAINYARD_HOME", Path.cwd() / "var")).resolve()


def store_root() -> Path:
    return home() / "datasets"


def cache_root() -> Path:
    return home() / "cache"


def runs_root() -> Path:
    return home() / "runs"


def run_path(job: str, run_key: str) -> Path:
    """Where a run's directory is: ``runs/<job>/<run key made filesystem-safe>`` (made by :func:`run_dir`)."""
    from trainyard.spec import safe_key

    return runs_root() / job / safe_key(run_key)


def run_dir(job: str, run_key: str) -> Path:
    """A run's directory (:func:`run_path`), created."""
    d = run_path(job, run_key)
    d.mkdir(parents=True, exist_ok=True)
    return d


def weights_root() -> Path:
    """Initial weights a recipe may start from (``recipe_options.init_weights`` names a file here)."""
    return home() / "weights"


def tensorboard_root() -> Path:
    return home() / "tensorboard"


def sweeps_root() -> Path:
    """The sweeps' Optuna studies, one journal file per team (:mod:`trainyard.sweeps.study`)."""
    return home() / "sweeps"


def mlflow_tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = home() / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def mlflow_artifact_root() -> str | None:
    """Where new experiments keep their artifacts: a folder of TRAINYARD_HOME with the embedded SQLite
    store; None with a tracking server (``MLFLOW_TRACKING_URI`` http(s)), which stores them itself (the
    cluster profile's ``mlflow server --serve-artifacts``)."""
    if mlflow_tracking_uri().startswith(("http://", "https://")):
        return None
    return (home() / "mlflow" / "artifacts").as_uri()
