"""The Airflow REST API for real: api-server, scheduler and dag-processor as processes, LocalExecutor.

Trigger train_pipeline with a conf and wait for success; trigger it with a conf its Params refuse (400)
and with one only the JobSpec refuses and see the first task fail naming the fields; no token -> 401; a
viewer cannot trigger (403).
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
DAG = "train_pipeline"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Airflow:
    def __init__(self, home: Path, trainyard_home: Path):
        self.home = home
        self.port = _free_port()
        self.url = f"http://localhost:{self.port}"
        bindir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "TRAINYARD_HOME": str(trainyard_home),
            "TRAINYARD_API_PORT": str(self.port),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)  # this Airflow's own database (xdist sets one)
        self.procs: list[subprocess.Popen] = []

    def run(self, *argv):
        subprocess.run(argv, env=self.env, check=True, capture_output=True, text=True, cwd=REPO)

    def setup(self):
        self.run(sys.executable, "scripts/render_airflow_cfg.py")
        # Airflow-level users for this test: admin, a viewer.
        cfg = self.home / "airflow.cfg"
        cfg.write_text(
            cfg.read_text().replace(
                "simple_auth_manager_users = admin:admin,operator:op,viewer:viewer",
                "simple_auth_manager_users = admin:admin,ann:viewer",
            )
        )
        self.run("airflow", "db", "migrate")
        pools = subprocess.run(
            ["trainyard", "pools", "--format", "airflow"], env=self.env, check=True, capture_output=True, text=True
        ).stdout
        (self.home / "pools.json").write_text(pools)
        self.run("airflow", "pools", "import", str(self.home / "pools.json"))
        self.run("trainyard", "models", "keygen", "--if-missing")  # registered versions are signed

    def start(self):
        for name in ("api-server", "scheduler", "dag-processor"):
            argv = ["airflow", name] + (["--port", str(self.port)] if name == "api-server" else [])
            # the child holds its own copy of the descriptor, so ours can close once it has started
            with open(self.home / f"{name}.log", "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
                    )
                )
        self.wait(lambda: requests.get(f"{self.url}/api/v2/monitor/health", timeout=5).ok, 600, "API server")

    def stop(self):
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n" + f.read_text()[-3000:] for f in self.home.glob("*.log"))

    def wait(self, predicate, seconds, what):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if predicate():
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def token(self, user: str) -> str:
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        r = requests.post(f"{self.url}/auth/token", json={"username": user, "password": passwords[user]}, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["access_token"]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    if not shutil.which("airflow", path=str(Path(sys.executable).parent)):
        pytest.fail("airflow is not installed in this environment: run the suite with `make test`")
    home = tmp_path_factory.mktemp("airflow_home")
    af = Airflow(home, tmp_path_factory.mktemp("trainyard_home"))
    af.setup()
    af.start()
    yield af
    af.stop()


def _wait_run(af, headers, run_id, seconds=900):
    state = {}

    def done():
        r = requests.get(f"{af.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=10)
        state["run"] = r.json()
        return r.json()["state"] in ("success", "failed")

    af.wait(done, seconds, f"run {run_id}")
    return state["run"]


def _task_instances(af, headers, run_id):
    r = requests.get(f"{af.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances", headers=headers, timeout=10)
    return {ti["task_id"]: ti for ti in r.json()["task_instances"]}


def _failure_report(af, headers, run_id, tis) -> str:
    """The states, then the log of every failed task and the tails of the Airflow processes' own logs."""
    lines = [str({t: ti["state"] for t, ti in tis.items()})]
    for task_id, ti in tis.items():
        if ti["state"] != "failed":
            continue
        for attempt in range(1, max(ti.get("try_number") or 1, 1) + 1):
            try:
                r = requests.get(
                    f"{af.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{attempt}",
                    headers={**headers, "Accept": "application/json"},
                    timeout=30,
                )
                text = r.text[-4000:]
            except requests.RequestException as err:  # the report must not hide the failure it reports
                text = f"(could not fetch it: {err})"
            lines.append(f"--- log of {task_id}, try {attempt}\n{text}")
    lines.append(af.logs())
    return "\n".join(lines)


def test_auth_is_required(airflow):
    assert requests.get(f"{airflow.url}/api/v2/dags", timeout=10).status_code == 401
    r = requests.post(f"{airflow.url}/api/v2/dags/{DAG}/dagRuns", json={"logical_date": None}, timeout=10)
    assert r.status_code == 401


def test_trigger_with_conf_runs_to_success(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('admin')}"}
    airflow.wait(
        lambda: requests.get(f"{airflow.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok,
        600,
        "the DAG to be parsed",
    )
    conf = {
        "hyperparameters": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1, "seed": 1},
        "resources": {"gpus_per_node": 1, "gpu_type": "cpu", "priority": 7},
        "gates": [{"metric": "val_accuracy", "min": 0.8}],
    }
    r = requests.post(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns",
        headers=headers,
        json={"logical_date": None, "conf": conf},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    run = _wait_run(airflow, headers, r.json()["dag_run_id"])
    tis = _task_instances(airflow, headers, run["dag_run_id"])
    assert run["state"] == "success", _failure_report(airflow, headers, run["dag_run_id"], tis)
    # The conf's resources reached the scheduler: pool, pool_slots and priority of the train task.
    train = tis["train"]
    assert (train["pool"], train["pool_slots"], train["priority_weight"]) == ("gpu-cpu", 1, 7)
    r = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run['dag_run_id']}/taskInstances/register/xcomEntries/return_value",
        headers=headers,
        timeout=10,
    )
    assert r.ok, r.text
    assert "version" in json.dumps(r.json()["value"])


def test_invalid_conf_fails_at_the_first_task(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('admin')}"}
    # what the JobSpec's schema forbids is refused by the Params (generated from it) before a run exists
    r = requests.post(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns",
        headers=headers,
        json={"logical_date": None, "conf": {"hyperparameters": {"epochs": -5}}},
        timeout=10,
    )
    assert r.status_code == 400 and "hyperparameters" in r.text and "minimum of 1" in r.text, r.text
    # a rule across fields is the first task's: the run fails there, naming the fields
    r = requests.post(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns",
        headers=headers,
        timeout=10,
        json={"logical_date": None, "conf": {"split": {"val_fraction": 0.6, "test_fraction": 0.5}}},
    )
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    run = _wait_run(airflow, headers, run_id, seconds=300)
    assert run["state"] == "failed"
    tis = _task_instances(airflow, headers, run_id)
    assert tis["validate_spec"]["state"] == "failed"
    assert {ti["state"] for t, ti in tis.items() if t != "validate_spec"} == {"upstream_failed"}
    log = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/validate_spec/logs/1",
        headers={**headers, "Accept": "application/json"},
        timeout=10,
    )
    assert log.ok, log.text
    assert "invalid JobSpec" in log.text and "val_fraction + test_fraction must be < 1" in log.text


def test_viewer_cannot_trigger(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('ann')}"}
    r = requests.post(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns", headers=headers, json={"logical_date": None}, timeout=10
    )
    assert r.status_code == 403
