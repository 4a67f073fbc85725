"""Helpers for tests that run DAGs with dag.test() or through Airflow's services."""

import pytest


def load_dag(dag_id: str):
    """A DAG object from dags/<dag_id>.py, for dag.test() against the migrated AIRFLOW_HOME database."""
    import importlib
    import os
    import sys
    from pathlib import Path

    if not os.environ.get("AIRFLOW_HOME"):
        pytest.fail("AIRFLOW_HOME is not set: run the suite with `make test`")
    dags = str(Path(__file__).resolve().parents[2] / "dags")
    if dags not in sys.path:
        sys.path.insert(0, dags)
    return getattr(importlib.import_module(dag_id), f"{dag_id}_dag")  # each file names its DAG <dag_id>_dag


def task_states(dr) -> dict:
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def xcoms(dr, key: str = "return_value") -> dict:
    """Every task's XCom ``key`` of a DAG run, by task id."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, key=key).all()
        return {r.task_id: XComModel.deserialize_value(r) for r in rows}


def grid_order(choices: list, seed: int, n: int) -> list:
    """The first ``n`` learning rates a grid sweep over ``choices`` trains, in order: what a test's premise
    on the order of its trials rests on."""
    from trainyard.spec import Sweep
    from trainyard.sweeps.study import grid_points

    parameter = {"name": "hyperparameters.learning_rate", "type": "categorical", "choices": choices}
    sweep = Sweep(name="order", sampler="grid", seed=seed, trials=len(choices), parameters=[parameter])
    return [p["hyperparameters.learning_rate"] for p in grid_points(sweep)][:n]


def staged_version(name: str, team: str, folder, user: str = "ann"):
    """A signed version of registered model ``name``, owned by ``team``, under its staging alias, as a
    ``register`` of that team's job leaves one (in the MLflow store and key pair of ``TRAINYARD_HOME``; the
    model's files written under ``folder``): (the MLflow client, the version number)."""
    from trainyard.registry import ownership, signing, versions
    from trainyard.tracking import mlflow_tracking as mt

    files = folder / "model"
    files.mkdir()
    (files / "MLmodel").write_text("flavors: {onnx: {}}\n")
    (files / "model.onnx").write_bytes(bytes(range(256)) * 16)
    c = mt.client()
    run = c.create_run(mt.experiment_id(c, name, team)).info.run_id
    c.log_artifacts(run, str(files), "model")
    ownership.claim(c, name, team)
    version = c.create_model_version(name, source=f"runs:/{run}/model", run_id=run, tags={"team": team}).version
    versions.sign_version(c, name, version, signing.load_private_key())
    versions.promote(c, name, version, "staging", user=user, reason="registered", trusted=signing.trusted_keys())
    return c, str(version)


def require_the_sandbox() -> None:
    """Skip a test whose jobs run custom commands where the host has no custom-command sandbox; fail it on
    a root machine, where the sandbox must be."""
    import os

    from trainyard.training.launchers.sandbox import unavailable_reason

    reason = unavailable_reason()
    if reason and os.geteuid() == 0:
        pytest.fail(f"the sandbox is missing on a root machine: {reason}")
    if reason:
        pytest.skip(f"no custom-command sandbox here: {reason}")


def airflow_with_its_config(tmp_path_factory, airflow_services):
    """An Airflow of ``airflow_services`` (not yet set up) with a config folder of its own (a test edits its
    resources.yaml as an operator would) and the quieter test settings."""
    import shutil
    from pathlib import Path

    af = airflow_services.Airflow(tmp_path_factory.mktemp("airflow_home"), tmp_path_factory.mktemp("trainyard_home"))
    af.trainyard_home = Path(af.env["TRAINYARD_HOME"])
    af.config_dir = tmp_path_factory.mktemp("config") / "config"
    shutil.copytree(Path(__file__).resolve().parents[2] / "include" / "config", af.config_dir)
    af.env["TRAINYARD_CONFIG_DIR"] = str(af.config_dir)
    af.env.update(airflow_services.QUIETER_FOR_TESTS)
    return af


def wait_for_dags(airflow, headers: dict, *dag_ids: str, seconds: float = 600) -> None:
    """Until ``airflow`` knows each of ``dag_ids`` (parsed and stored): before that, Airflow answers 404 for
    it, not what a test asks of it (a 403 of another team's DAG, a run)."""
    import requests

    for dag_id in dag_ids:
        url = f"{airflow.url}/api/v2/dags/{dag_id}"
        airflow.wait(lambda url=url: requests.get(url, headers=headers, timeout=10).ok, seconds, dag_id)


def trainyard_cli(airflow, *argv: str, token: str | None = None, env: dict | None = None, timeout: float = 120):
    """``trainyard *argv`` against ``airflow`` as the user ``token`` names (none: nobody logged in unless
    ``env`` says otherwise): the finished process, its output captured as text."""
    import subprocess
    from pathlib import Path

    env = {**airflow.env, "AIRFLOW_API_URL": airflow.url, **(env or {})}
    if token:
        env["AIRFLOW_API_TOKEN"] = token
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run(["trainyard", *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=repo)
