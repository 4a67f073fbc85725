"""A team's MLflow experiments, runs and models, readable by its members only on a tracking server that runs
MLflow's own authentication app (the cluster profile's): a real ``mlflow server --app-name basic-auth``,
trainyard's tasks logging as its service account, users asking over MLflow's REST API (what its UI calls)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.integration
SERVICE, SERVICE_PASSWORD = "trainyard", "service-password-of-the-test"
PASSWORDS = {"alice": "alice-password-1234", "tina": "tina-password-12345", "root": "root-password-12345"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An MLflow tracking server with the auth app, its stores under a temp folder: its URL."""
    from trainyard.tracking.mlflow_auth import server_env, write_config

    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    config = write_config(root / "auth.ini", f"sqlite:///{root / 'auth.db'}", SERVICE, SERVICE_PASSWORD)
    env = {**os.environ, **server_env(config, "csrf-key-of-the-test"), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow = Path(sys.executable).parent / "mlflow"
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(mlflow), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts",
         "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert proc.poll() is None and time.time() < deadline, (root / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(30)
    log.close()


@pytest.fixture
def as_service(server, monkeypatch, trainyard_home):
    """This process logs as trainyard's tasks do on the cluster profile: the service account."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", SERVICE)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SERVICE_PASSWORD)
    return server


def _get(url: str, path: str, user: str, **params) -> requests.Response:
    return requests.get(f"{url}/api/2.0/mlflow/{path}", params=params, auth=(user, PASSWORDS[user]), timeout=30)


def test_a_team_s_experiments_runs_and_models_are_read_by_its_members_only(as_service):
    from trainyard.errors import PermanentError
    from trainyard.registry import ownership
    from trainyard.teams import NotAllowed
    from trainyard.tracking import mlflow_auth
    from trainyard.tracking import mlflow_tracking as mt

    url, c = as_service, mt.client()
    made = {}
    for team, name in (("vision", "vision-net"), ("default", "default-net")):
        run = mt.ensure_run(c, name, f"train_pipeline.{team}/r1", "r1", team, {})
        ownership.claim(c, name, team)
        made[team] = (c.get_experiment_by_name(name).experiment_id, run, name)
    with pytest.raises(mt.ExperimentOfAnotherTeam, match="'vision-net' belongs to team 'vision'"):
        mt.ensure_run(c, "vision-net", "train_pipeline.default/r2", "r2", "default", {})

    logins = {user: mlflow_auth.Login(password, admin=user == "root") for user, password in PASSWORDS.items()}
    teams_of = {"alice": ["vision"], "tina": ["default"], "root": []}
    teams = ["default", "vision"]
    assert mlflow_auth.sync(c, teams, teams_of, logins) == teams_of

    def reads(user: str, team: str) -> set[int]:
        experiment, run, model = made[team]
        return {
            _get(url, "experiments/get", user, experiment_id=experiment).status_code,
            _get(url, "runs/get", user, run_id=run).status_code,
            _get(url, "registered-models/get", user, name=model).status_code,
        }

    def listed(user: str) -> set[str]:
        r = requests.post(
            f"{url}/api/2.0/mlflow/experiments/search",
            json={"max_results": 100},
            auth=(user, PASSWORDS[user]),
            timeout=30,
        )
        return {e["name"] for e in r.json().get("experiments", [])}

    assert reads("alice", "vision") == {200} and reads("tina", "default") == {200}
    assert reads("alice", "default") == {403} and reads("tina", "vision") == {403}
    assert reads("root", "vision") == {200}  # an Airflow admin is an MLflow admin
    assert listed("alice") == {"vision-net"} and listed("tina") == {"default-net"}
    assert requests.get(f"{url}/api/2.0/mlflow/experiments/search", timeout=30).status_code == 401  # no login

    # tina makes vision's next experiment before its job does (MLflow lets any user make one, and gives its
    # maker MANAGE): the job refuses it, unsealed; the sync takes tina's rights away and seals it
    squat = {"name": "squat-net", "tags": [{"key": "trainyard.team", "value": "vision"}]}
    squatting = requests.post(
        f"{url}/api/2.0/mlflow/experiments/create", json=squat, auth=("tina", PASSWORDS["tina"]), timeout=30
    )
    assert squatting.ok, squatting.text
    with pytest.raises(PermanentError, match="experiment 'squat-net' was not made by trainyard's service account"):
        mt.ensure_run(c, "squat-net", "train_pipeline.vision/r3", "r3", "vision", {})
    mlflow_auth.sync(c, teams, teams_of, logins)
    squatted = mt.ensure_run(c, "squat-net", "train_pipeline.vision/r3", "r3", "vision", {})
    assert _get(url, "runs/get", "tina", run_id=squatted).status_code == 403
    assert _get(url, "runs/get", "alice", run_id=squatted).status_code == 200

    # root is no longer an Airflow user: no MLflow account either
    mlflow_auth.sync(c, teams, teams_of, {u: login for u, login in logins.items() if u != "root"})
    assert _get(url, "experiments/get", "root", experiment_id=made["vision"][0]).status_code == 401

    # alice leaves team vision, and vision's model is given to team default: MLflow follows at the next sync
    ownership.set_owner(c, "vision-net", "default", replace=True)
    mlflow_auth.sync(c, teams, {**teams_of, "alice": []}, logins)
    assert reads("alice", "vision") == {403}
    assert _get(url, "registered-models/get", "tina", name="vision-net").status_code == 200
    assert _get(url, "runs/get", "tina", run_id=made["vision"][1]).status_code == 200  # its runs go with it
    assert mt.experiment_owner(c, "vision-net") == "default"
    mt.ensure_run(c, "vision-net", "train_pipeline.default/r4", "r4", "default", {})  # team default's job now
    with pytest.raises(NotAllowed):  # and no longer vision's: the policy check of a job's first task
        from trainyard.teams import check_owner

        check_owner("vision-net", mt.experiment_owner(c, "vision-net"), "vision", what="MLflow experiment")
