"""The checkout's programs outside its packages (``bench/``, ``scripts/``) as modules for the tests: each is
loaded once, by its path, under the name its neighbours import it by (``bench/scheduler.py`` imports
``airflow_services``; its Celery replay, ``cluster``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load(relative: str, name: str | None = None) -> ModuleType:
    """The module of the file ``relative`` to the checkout, loaded on the first call (as ``name``, by
    default the file's stem)."""
    name = name or Path(relative).stem
    if relative.startswith("bench/") and relative != "bench/child_process.py":
        load("bench/child_process.py")  # the benchmarks' shared helper, imported by that name
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def airflow_services() -> ModuleType:
    return load("bench/airflow_services.py")


def cluster_profile() -> ModuleType:
    return load("scripts/cluster.py", "cluster")


def orchestration_bench() -> ModuleType:
    airflow_services()
    return load("bench/orchestration.py")


def scheduler_replay() -> ModuleType:
    airflow_services()
    return load("bench/scheduler.py", "bench_scheduler")
