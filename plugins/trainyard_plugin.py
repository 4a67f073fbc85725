"""trainyard's Airflow plugin: the extra links of its training and evaluation tasks (MLflow run,
TensorBoard), which the UI resolves by class (``trainyard_airflow.links``), the Jobs and Fleet
pages (``trainyard_airflow.pages``: served by the api-server under ``/trainyard``, in the UI's navigation), and
a note on every training run saying which job it is (``trainyard_airflow.run_notes``, in the scheduler)."""

import sys

from airflow.plugins_manager import AirflowPlugin

from trainyard_airflow import run_notes
from trainyard_airflow.links import MlflowRunLink, ModelVersionLink, TensorBoardLink


def _pages() -> list[dict]:
    """The Fleet page's app where FastAPI apps are served: in the api-server, which imports FastAPI before it
    loads the plugins. Every other process that loads plugins (a task, a triggerer, a worker) would import
    FastAPI for nothing (0.12 CPU-s each)."""
    if "fastapi" not in sys.modules:
        return []
    from trainyard_airflow.pages import app

    return [{"app": app, "url_prefix": "/trainyard", "name": "trainyard pages"}]


class TrainyardPlugin(AirflowPlugin):
    name = "trainyard"
    operator_extra_links = [MlflowRunLink(), TensorBoardLink(), ModelVersionLink()]
    fastapi_apps = _pages()
    listeners = [run_notes]
    external_views = [
        {"name": "Jobs", "href": "/trainyard/jobs", "destination": "nav", "url_route": "jobs", "category": "browse"},
        {"name": "Fleet", "href": "/trainyard/fleet", "destination": "nav", "url_route": "fleet", "category": "browse"},
    ]
