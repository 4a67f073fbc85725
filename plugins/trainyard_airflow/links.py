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


class MlflowRunLink(BaseOperatorLink):
    name = "MLflow run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from trainyard.tracking import mlflow_tracking as mt

        run_id = _trained(ti_key).get("mlflow_run_id")
        if not run_id:
            return ""
        base = os.environ.get("TRAINYARD_MLFLOW_URL", "http://localhost:5000").rstrip("/")
        experiment = mt.client().get_run(run_id).info.experiment_id
        return f"{base}/#/experiments/{experiment}/runs/{run_id}"


class TensorBoardLink(BaseOperatorLink):
    name = "TensorBoard"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from pathlib import Path

        from trainyard import paths

        board = _trained(ti_key).get("tensorboard_dir")
        if not board:
            return ""
        base = os.environ.get("TRAINYARD_TENSORBOARD_URL", "http://localhost:6006").rstrip("/")
        try:
            run = Path(board).relative_to(paths.tensorboard_root()).as_posix()
        except ValueError:
            run = Path(board).name
        return f"{base}/?runFilter={quote(run, safe='')}#timeseries"


LINKS = (MlflowRunLink(), TensorBoardLink())
