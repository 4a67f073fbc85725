"""Pick a DatasetStore backend by name (the JobSpec's ``dataset.store``)."""

from __future__ import annotations

STORES = ("local", "lakefs")


def open_store(kind: str, root=None):
    """``local``: the embedded store under TRAINYARD_HOME; ``lakefs``: credentials from LAKEFS_* variables
    (inside Airflow, the lakefs_default connection via LakeFSHook)."""
    if kind == "local":
        from trainyard import paths
        from trainyard.data.store import LocalStore

        return LocalStore(root or paths.store_root())
    if kind == "lakefs":
        from trainyard.data.lakefs_store import LakeFSStore

        return LakeFSStore.from_env()
    raise ValueError(f"unknown dataset store {kind!r}; allowed: {list(STORES)}")
