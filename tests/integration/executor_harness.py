"""Test helper: Airflow as its users meet it (api-server, scheduler, dag-processor and triggerer as processes,
LocalExecutor, the real task supervisor), for the test modules that prove things under the executor; and the
`trainyard` command run against it."""

import contextlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("airflow_services", REPO / "bench" / "airflow_services.py")
airflow_services = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(airflow_services)

DAG = "train_pipeline"


@contextlib.contextmanager
def airflow_under_the_executor(tmp_path_factory) -> Iterator:
    """A started Airflow with users admin and tina (who may trigger runs and nothing more), a config folder
    and a jobs folder of its own (tests edit them as an operator would); skipped where the custom-command
    sandbox cannot be made, failed where it should (as root)."""
    from trainyard.training.launchers.sandbox import unavailable_reason

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
    af.jobs_dir = tmp_path_factory.mktemp("jobs")  # retraining job files, read by the dag-processor
    af.env["TRAINYARD_JOBS_DIR"] = str(af.jobs_dir)
    af.setup(users="admin:admin,tina:user")
    af.trainyard_home = trainyard_home
    af.start()
    try:
        headers = af.headers("admin")
        af.wait(lambda: requests.get(f"{af.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok, 600, "the DAG")
        yield af
    finally:
        af.stop()


def trainyard(
    airflow, *argv: str, token: str | None = None, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The `trainyard` command with the Airflow processes' settings, at this Airflow, as ``token``'s user."""
    env = {**airflow.env, "AIRFLOW_API_URL": airflow.url, **(env or {})}
    if token:
        env["AIRFLOW_API_TOKEN"] = token
    return subprocess.run(["trainyard", *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
