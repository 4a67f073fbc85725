"""trainyard's Airflow plugin: registers the extra links of its training and evaluation tasks (MLflow run,
TensorBoard), which the UI resolves by class (``trainyard_airflow.links``)."""

from airflow.plugins_manager import AirflowPlugin

from trainyard_airflow.links import MlflowRunLink, TensorBoardLink


class TrainyardPlugin(AirflowPlugin):
    name = "trainyard"
    operator_extra_links = [MlflowRunLink(), TensorBoardLink()]
