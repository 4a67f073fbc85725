"""LocalExecutor whose tasks start with the heavy libraries already imported.

Every Airflow task runs in a process forked from a LocalExecutor worker, which is forked from the
scheduler, and each task of train_pipeline imported torch, MLflow, scikit-learn, great-expectations,
onnxruntime, the ONNX exporter, matplotlib and the Kubernetes provider (the DAG file's) again: about 5 s of
imports across a run's tasks on 2 cores, for steps that take 0.01-0.1 s of work (``bench/orchestration.py``
shows each task against the same step in one process). This executor imports them once in the scheduler,
before the workers are forked, so the workers and every task they fork share the loaded modules copy-on-write.

``[trainyard] preload_modules`` (comma-separated; empty turns it off) names them; the default is
``DEFAULT_PRELOAD``, third-party libraries only. The cost: the scheduler starts a few seconds later and
holds them (about 800 MB, shared with the workers and tasks), and an upgrade of one of them needs a
scheduler restart (as any upgrade does). A module that fails to import is logged and skipped: the tasks
then import it themselves, as with the plain LocalExecutor. Where processes are spawned rather than forked
(macOS; forkserver, Python 3.14's default on Linux), nothing is preloaded, as nothing would be inherited,
and the scheduler log says so. Imports only: nothing is run, and no thread is started (torch starts its
thread pools at the first operation, in the task).

The CeleryExecutor's workers do the same (:mod:`trainyard_airflow.celery_config`): each worker imports them
when it starts, before it forks its pool, whose processes fork the task processes.
"""

from __future__ import annotations

import importlib
import time

from airflow.configuration import conf
from airflow.executors.local_executor import LocalExecutor

# Third-party libraries only: trainyard's own modules stay out, so a change to them reaches the next task
# without a scheduler restart (these libraries change only with an upgrade, which restarts it anyway).
DEFAULT_PRELOAD = (
    "airflow.providers.cncf.kubernetes.operators.job",
    "torch",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",  # a local store's first client: its models and migrations
    "mlflow.store.model_registry.sqlalchemy_store",
    "sklearn.metrics",
    "great_expectations",
    "onnx",
    "onnxruntime",
    # the ONNX export's TorchDynamo exporter, imported by every export_onnx (docs/performance.md)
    "torch._dynamo",
    "torch.onnx._internal.exporter._core",
    "onnxscript",
    "matplotlib.pyplot",  # the run report's curves, drawn at the gate
    "lmdb",
)


def preload_modules() -> list[str]:
    raw = conf.get("trainyard", "preload_modules", fallback=",".join(DEFAULT_PRELOAD))
    return [m.strip() for m in raw.split(",") if m.strip()]


def preload(log) -> None:
    """Import ``preload_modules()`` in this process (one that forks the task processes later), logging to
    ``log`` what it loaded and what it skipped: a module that fails to import is left to the tasks."""
    t0 = time.monotonic()
    loaded, failed = [], []
    for name in preload_modules():
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as err:  # noqa: BLE001 - a task importing it itself is the fallback
            failed.append(f"{name} ({type(err).__name__}: {err})")
    log.info("preloaded %s for the tasks in %.1f s", ", ".join(loaded) or "nothing", time.monotonic() - t0)
    if failed:
        log.warning("could not preload %s; tasks will import them themselves", "; ".join(failed))


class PreloadingLocalExecutor(LocalExecutor):
    """LocalExecutor + ``[trainyard] preload_modules`` imported before its workers are forked."""

    def start(self) -> None:
        if self.is_mp_using_fork:
            preload(self.log)
        elif preload_modules():
            self.log.warning("workers are not forked here: [trainyard] preload_modules has no effect")
        super().start()
