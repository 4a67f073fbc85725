"""Pick a DatasetStore backend by name (the JobSpec's ``dataset.store``)."""

from __future__ import annotations

import os
from collections.abc import Callable

STORES = ("local", "lakefs")

# Factories registered by the caller's environment; the Airflow layer registers one that reads the
# lakefs_default connection, so this library never imports Airflow.
_factories: dict[str, Callable[[], object]] = {}


def register(kind: str, factory: Callable[[], object]) -> None:
    if kind not in STORES:
        raise ValueError(f"unknown dataset store {kind!r}; allowed: {list(STORES)}")
    _factories[kind] = factory


def open_store(kind: str, root=None):
    """``local``: the embedded store under TRAINYARD_HOME; ``lakefs``: LAKEFS_* variables when set,
    else a registered factory (in Airflow: the lakefs_default connection)."""
    if kind == "local":
        from trainyard import paths
        from trainyard.data.store import LocalStore

        return LocalStore(root or paths.store_root())
    if kind == "lakefs":
        from trainyard.data.lakefs_store import LakeFSStore

        if not os.environ.get("LAKEFS_ENDPOINT") and kind in _factories:
            return _factories[kind]()
        return LakeFSStore.from_env()
    raise ValueError(f"unknown dataset store {kind!r}; allowed: {list(STORES)}")
