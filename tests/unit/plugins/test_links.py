"""The Airflow UI's links from a training task to its MLflow run and its TensorBoard curves
(trainyard_airflow.links): read from the task's own result, else training_result's; none without one."""

from types import SimpleNamespace

import pytest

from trainyard_airflow.links import MlflowRunLink, TensorBoardLink


def _ti(own: dict | None, training_result: dict | None = None, pushed: dict | None = None):
    """A ``train`` task instance as a link sees it: its result ``own``, ``training_result``'s, and the link
    XComs it ``pushed`` (key -> value)."""

    def xcom_pull(task_ids, map_indexes=-1, key="return_value"):
        if key != "return_value":
            return (pushed or {}).get(key) if task_ids == "train" else None
        return own if task_ids == "train" else training_result

    def xcom_push(key, value):
        pushed_here[key] = value

    pushed_here = pushed if pushed is not None else {}
    return SimpleNamespace(task_id="train", map_index=-1, xcom_pull=xcom_pull, xcom_push=xcom_push)


@pytest.fixture
def mlflow_run(trainyard_home, monkeypatch) -> tuple[str, str]:
    """(experiment id, run id) of a run in team default's experiment ``digits``, with MLflow's UI served at
    http://mlflow.example:5000 and TensorBoard nowhere."""
    from trainyard.tracking import mlflow_tracking as mt

    monkeypatch.setenv("TRAINYARD_MLFLOW_URL", "http://mlflow.example:5000/")
    monkeypatch.delenv("TRAINYARD_TENSORBOARD_URL", raising=False)
    c = mt.client()
    experiment = mt.experiment_id(c, "digits", "default")
    return experiment, c.create_run(experiment).info.run_id


def test_the_links_go_to_the_trained_run_and_its_curves(mlflow_run, monkeypatch):
    from trainyard import paths

    experiment, run = mlflow_run
    board = paths.tensorboard_root() / "digits" / "r 1"
    trained = {"mlflow_run_id": run, "tensorboard_dir": str(board)}

    mlflow_link = MlflowRunLink().get_link(None, ti_key=_ti(trained))
    assert mlflow_link == f"http://mlflow.example:5000/#/experiments/{experiment}/runs/{run}"
    assert TensorBoardLink().get_link(None, ti_key=_ti(trained)) == ""  # nothing serves TensorBoard: no link
    monkeypatch.setenv("TRAINYARD_TENSORBOARD_URL", "http://localhost:6006")  # an operator serves it there
    board_link = TensorBoardLink().get_link(None, ti_key=_ti(trained))
    assert board_link == "http://localhost:6006/?runFilter=digits%2Fr%201#timeseries"
    # a later task (evaluate) links through training_result's
    assert MlflowRunLink().get_link(None, ti_key=_ti(None, trained)) == mlflow_link


def test_no_training_result_no_link():
    for ti in (_ti(None), _ti({"mlflow_run_id": ""}, {"tensorboard_dir": ""})):
        assert MlflowRunLink().get_link(None, ti_key=ti) == ""
        assert TensorBoardLink().get_link(None, ti_key=ti) == ""


def test_a_training_pushes_its_links_as_it_starts(mlflow_run):
    """The XComs the UI reads a task's links from, pushed by the training task once its MLflow run exists."""
    from trainyard_airflow.links import push_while_training

    experiment, run = mlflow_run
    pushed: dict = {}
    ti = _ti(None, pushed=pushed)
    push_while_training(ti, SimpleNamespace(mlflow_run_id=run, tensorboard_dir="/tb/digits/r1"))
    # the key Airflow keeps the MLflow link under; no TensorBoard link where nothing serves it
    link = f"http://mlflow.example:5000/#/experiments/{experiment}/runs/{run}"
    assert pushed == {"_link_MlflowRunLink": link}
    # the training failed (no result): its end keeps the link it showed while it trained
    assert MlflowRunLink().get_link(None, ti_key=ti) == link and TensorBoardLink().get_link(None, ti_key=ti) == ""
    # MLflow unreachable as it starts: no link yet, and the training goes on
    push_while_training(_ti(None), SimpleNamespace(mlflow_run_id="no-such-run", tensorboard_dir=""))
