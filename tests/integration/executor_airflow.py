"""The test Airflow of the files that run jobs as users do, through the real scheduler, executor and
triggerer (test_under_the_executor.py, test_rest_api.py): api-server, scheduler, dag-processor and the
triggerers of teams default and vision as processes, LocalExecutor, the tasks' supervisor socket on every
task process's stdin. Each of those files starts its own (a module fixture), so xdist runs the two side by
side.

Its users: admin; tina (role user) of team default only; alice (user) of team vision; ann, a viewer; bob
(op) of teams default and nlp (resources.yaml). It has a config folder of its own (a test edits its
resources.yaml as an operator would), a folder of retraining job files, a folder on the tasks' sys.path, and
a secret Variable and Connection that a custom command must not reach.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import checkout

REPO = Path(__file__).resolve().parents[2]
airflow_services = checkout.airflow_services()

# Each team triggers its own training DAG (Airflow's multi-team mode): tina's are team default's
DAG, VISION_DAG = "train_pipeline.default", "train_pipeline.vision"
INGEST, VISION_INGEST = "ingest_dataset.default", "ingest_dataset.vision"  # each team's own uploads
SECRET_VARIABLE, SECRET_VALUE = "warehouse_token", "s3cr3t-variable-value"
SECRET_CONNECTION, SECRET_PASSWORD = "warehouse_db", "s3cr3t-connection-password"
USERS = "admin:admin,tina:user,alice:user,ann:viewer,bob:op"


def started(tmp_path_factory) -> Iterator:
    """The Airflow described above, once its training DAG is parsed; stopped when the generator is closed
    (``yield from`` it in a module fixture)."""
    from trainyard.training.launchers.sandbox import unavailable_reason

    if not shutil.which("airflow", path=str(Path(sys.executable).parent)):
        pytest.fail("airflow is not installed in this environment: run the suite with `make test`")
    reason = unavailable_reason()
    if reason and os.geteuid() == 0:
        pytest.fail(f"the sandbox is missing on a root machine: {reason}")
    if reason:
        pytest.skip(f"no custom-command sandbox here: {reason}")
    trainyard_home = tmp_path_factory.mktemp("trainyard_home")
    af = airflow_services.Airflow(tmp_path_factory.mktemp("airflow_home"), trainyard_home)
    af.config_dir = tmp_path_factory.mktemp("config") / "config"
    shutil.copytree(REPO / "include" / "config", af.config_dir)
    af.env["TRAINYARD_CONFIG_DIR"] = str(af.config_dir)
    af.env.update(airflow_services.QUIETER_FOR_TESTS)
    af.jobs_dir = tmp_path_factory.mktemp("jobs")  # retraining job files, read by the dag-processor
    af.env["TRAINYARD_JOBS_DIR"] = str(af.jobs_dir)
    # a folder on the tasks' sys.path: a package put there later is installed as far as they can tell
    af.site = tmp_path_factory.mktemp("worker_site")
    af.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(af.site), os.environ.get("PYTHONPATH")]))
    af.setup(users=USERS)
    af.run("airflow", "variables", "set", SECRET_VARIABLE, SECRET_VALUE)
    af.run(
        "airflow", "connections", "add", SECRET_CONNECTION, "--conn-uri",
        f"postgresql://reader:{SECRET_PASSWORD}@db.internal:5432/warehouse",
    )  # fmt: skip
    af.start(teams=("default", "vision"))  # the users' teams: the other teams' triggerers would idle
    headers = af.headers("admin")
    af.wait(lambda: requests.get(f"{af.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok, 600, "the DAG")
    af.trainyard_home = trainyard_home
    try:
        yield af
    finally:
        af.stop()


def trainyard(
    airflow, *argv: str, token: str | None = None, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The ``trainyard`` command against this Airflow, as ``token``'s user."""
    env = {**airflow.env, "AIRFLOW_API_URL": airflow.url, **(env or {})}
    if token:
        env["AIRFLOW_API_TOKEN"] = token
    return subprocess.run(["trainyard", *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
