"""Extra links of the training and evaluation tasks in the Airflow UI: the run in MLflow and its curves in
TensorBoard, from the moment the training starts.

Airflow 3 computes a task's links on the worker as the task ends and keeps each as an XCom (its
``xcom_key``), which the UI shows: :meth:`get_link` reads the MLflow run of what the task trained from the
task's own result, or from ``training_result`` for the tasks after it. A training task pushes the same
XComs as soon as its MLflow run exists (:func:`push_while_training`), so the links are there while it
trains, not only once it has ended. Where the UIs are served is configuration: ``TRAINYARD_MLFLOW_URL``
(default http://localhost:5000, ``mlflow ui``) and ``TRAINYARD_TENSORBOARD_URL`` (unset: no TensorBoard
link, as nothing serves it; ``tensorboard --logdir $TRAINYARD_HOME/tensorboard`` serves it at
http://localhost:6006)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from trainyard.tracking import mlflow_tracking  # 34 ms, no MLflow: where MLflow's UI is


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
        """The link as the task ends: to what it trained; for a training that failed (no result), the one
        it pushed as it started (:func:`push_while_training`), which its end would otherwise blank out."""
        url = self.url(_trained(ti_key).get(self.field))
        if url:
            return url
        pushed = ti_key.xcom_pull(
            task_ids=ti_key.task_id, key=self.xcom_key, map_indexes=getattr(ti_key, "map_index", -1)
        )
        return pushed if isinstance(pushed, str) else ""

    def url(self, value: str | None) -> str:
        """The link to ``value`` (the training's ``field``): none without a value or a UI to show it in."""
        base = os.environ.get(self.url_env, self.default_url).rstrip("/")
        return self.target(base, value) if value and base else ""

    def target(self, base: str, value: str) -> str:
        raise NotImplementedError


class MlflowRunLink(_TrainedRunLink):
    name = "MLflow run"
    field, url_env, default_url = "mlflow_run_id", mlflow_tracking.UI_URL_ENV, mlflow_tracking.UI_URL_DEFAULT

    def target(self, base: str, value: str) -> str:
        from trainyard.tracking import mlflow_tracking as mt

        return mt.run_page(base, mt.client().get_run(value).info.experiment_id, value)


class TensorBoardLink(_TrainedRunLink):
    name = "TensorBoard"
    field, url_env, default_url = "tensorboard_dir", "TRAINYARD_TENSORBOARD_URL", ""

    def target(self, base: str, value: str) -> str:
        from pathlib import Path

        from trainyard import paths

        try:
            run = Path(value).relative_to(paths.tensorboard_root()).as_posix()
        except ValueError:
            run = Path(value).name
        return f"{base}/?runFilter={quote(run, safe='')}#timeseries"


LINKS = (MlflowRunLink(), TensorBoardLink())


class ModelVersionLink(BaseOperatorLink):
    """The ``register`` task's link: the model version it registered, in MLflow's model registry."""

    name = "Model version"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from trainyard.tracking import mlflow_tracking as mt

        registered = ti_key.xcom_pull(task_ids=ti_key.task_id)
        if not isinstance(registered, dict) or not registered.get("name") or registered.get("version") is None:
            return ""
        base = mt.ui_url()
        return mt.model_version_page(base, registered["name"], registered["version"]) if base else ""


def push_while_training(ti: Any, training: Any) -> None:
    """The links to a training that has just started (``training``: its plan, with ``mlflow_run_id`` and
    ``tensorboard_dir``), as the XComs the UI reads them from; the task's end writes them again. A link that
    cannot be made (MLflow unreachable for a moment) is logged and left to the task's end: never the
    training's failure."""
    import logging

    for link in LINKS:
        try:
            url = link.url(getattr(training, link.field, None))
            if url:
                ti.xcom_push(key=link.xcom_key, value=url)
        except Exception as err:  # noqa: BLE001 - a link is a convenience; the training goes on
            logging.getLogger(__name__).warning("could not show the %s link yet: %s", link.name, err)
