"""trainyard's Airflow plugin: the extra links of its training and evaluation tasks (MLflow run,
TensorBoard), which the UI resolves by class (``trainyard_airflow.links``), and the Fleet page
(``trainyard_airflow.pages``: served by the api-server under ``/trainyard``, in the UI's navigation)."""

from airflow.plugins_manager import AirflowPlugin

from trainyard_airflow.links import MlflowRunLink, TensorBoardLink
from trainyard_airflow.pages import app as pages


class TrainyardPlugin(AirflowPlugin):
    name = "trainyard"
    operator_extra_links = [MlflowRunLink(), TensorBoardLink()]
    fastapi_apps = [{"app": pages, "url_prefix": "/trainyard", "name": "trainyard pages"}]
    external_views = [
        {"name": "Fleet", "href": "/trainyard/fleet", "destination": "nav", "url_route": "fleet", "category": "browse"}
    ]
