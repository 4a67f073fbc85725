"""Extra links of the training and evaluation tasks in the Airflow UI: the run in MLflow and its curves in
TensorBoard.

Airflow 3 computes a task's links on the worker as the task ends and keeps each as an XCom, which the UI
shows: :meth:`get_link` reads the MLflow run of what the task trained from the task's own result, or from
``training_result`` for the tasks after it. Where the UIs are served is configuration:
``TRAINYARD_MLFLOW_URL`` (default http://localhost:5000, ``mlflow ui``) and ``TRAINYARD_TENSORBOARD_URL``
(default http://localhost:6006, ``tensorboard --logdir $TRAINYARD_HOME/tensorboard``)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink


def _trained(ti: Any) -> dict:
    """The result of the training this task ran or follows: its own (train, train_trial, collect) or
    ``training_result``'s."""
    own = ti.xcom_pull(task_ids=ti.task_id, map_indexes=getattr(ti, "map_index", -1))
    if isinstance(own, dict) and own.get("mlflow_run_id"):
        return own
    found = ti.xcom_pull(task_ids="training_result")
    return found if isinstance(found, dict) else {}


class _TrainedRunLink(BaseOperatorLink):
    """A link to what the task trained, in a UI served at ``$<url_env>`` (default ``default_url``): none
    where the training's result has no ``field``."""

    field: str
    url_env: str
    default_url: str

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        value = _trained(ti_key).get(self.field)
        if not value:
            return ""
        return self.target(os.environ.get(self.url_env, self.default_url).rstrip("/"), value)

    def target(self, base: str, value: str) -> str:
        raise NotImplementedError


class MlflowRunLink(_TrainedRunLink):
    name = "MLflow run"
    field, url_env, default_url = "mlflow_run_id", "TRAINYARD_MLFLOW_URL", "http://localhost:5000"

    def target(self, base: str, value: str) -> str:
        from trainyard.tracking import mlflow_tracking as mt

        experiment = mt.client().get_run(value).info.experiment_id
        return f"{base}/#/experiments/{experiment}/runs/{value}"


class TensorBoardLink(_TrainedRunLink):
    name = "TensorBoard"
    field, url_env, default_url = "tensorboard_dir", "TRAINYARD_TENSORBOARD_URL", "http://localhost:6006"

    def target(self, base: str, value: str) -> str:
        from pathlib import Path

        from trainyard import paths

        try:
            run = Path(value).relative_to(paths.tensorboard_root()).as_posix()
        except ValueError:
            run = Path(value).name
        return f"{base}/?runFilter={quote(run, safe='')}#timeseries"


LINKS = (MlflowRunLink(), TensorBoardLink())
