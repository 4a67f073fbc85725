"""The Airflow REST API for real: api-server, scheduler and dag-processor as processes, LocalExecutor.

Trigger train_pipeline with a conf and wait for success; trigger it with a conf its Params refuse (400)
and with one only the JobSpec refuses and see the first task fail naming the fields; no token -> 401; a
viewer cannot trigger (403); a user may trigger but not run the job of a team they are not in.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import requests

import checkout

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
DAG = "train_pipeline.default"  # team default's own (multi-team mode)
airflow_services = checkout.airflow_services()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    if not shutil.which("airflow", path=str(Path(sys.executable).parent)):
        pytest.fail("airflow is not installed in this environment: run the suite with `make test`")
    home = tmp_path_factory.mktemp("airflow_home")
    af = airflow_services.Airflow(home, tmp_path_factory.mktemp("trainyard_home"))
    af.env.update(airflow_services.QUIETER_FOR_TESTS)
    # Airflow-level users for these tests: admin, a viewer, and bob, who may trigger (op) and is in team nlp
    af.setup(users="admin:admin,ann:viewer,bob:op")
    af.start(teams=("default",))  # every run here is team default's (vision's is refused before it runs)
    yield af
    af.stop()


def _wait_run(af, headers, run_id, seconds=900):
    return af.wait_run(DAG, run_id, headers, seconds)


def _task_instances(af, headers, run_id):
    return af.task_instances(DAG, run_id, headers)


def _post_run(af, headers, conf=None, dag_id=DAG) -> requests.Response:
    """Airflow's answer to a trigger of ``dag_id`` with ``conf`` (none: the DAG's defaults)."""
    body = {"logical_date": None} if conf is None else {"logical_date": None, "conf": conf}
    return requests.post(f"{af.url}/api/v2/dags/{dag_id}/dagRuns", headers=headers, json=body, timeout=10)


def test_auth_is_required(airflow):
    assert requests.get(f"{airflow.url}/api/v2/dags", timeout=10).status_code == 401
    r = _post_run(airflow, {})
    assert r.status_code == 401


def test_trigger_with_conf_runs_to_success(airflow, tmp_path):
    """A run triggered with a conf succeeds; it is bench/orchestration.py's scheduled side, so the benchmark
    is run here, at its smallest (one run a side), against this Airflow rather than a second one."""
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
    lines, (run_id,) = checkout.orchestration_bench().measure(airflow, conf, 1, tmp_path / "plain")
    report = "\n".join(lines)
    wall = r"pipeline wall: first run +in process +[\d.]+ s +under Airflow +[\d.]+ s +ratio [\d.]+x"
    assert re.search(wall, report), report
    assert re.search(r"gap between tasks: median [\d.]+ s, p95 [\d.]+ s \(12 tasks\)", report), report
    assert re.search(r"\n  register +[\d.]+ s +[\d.]+ s", report), report
    tis = _task_instances(airflow, headers, run_id)  # the run succeeded: measure says why when it did not
    # The conf's resources reached the scheduler: pool, pool_slots and priority of the train task.
    train = tis["train"]
    assert (train["pool"], train["pool_slots"], train["priority_weight"]) == ("gpu-cpu", 1, 1007)
    r = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/register/xcomEntries/return_value",
        headers=headers,
        timeout=10,
    )
    assert r.ok, r.text
    assert "version" in json.dumps(r.json()["value"])


def test_invalid_conf_fails_at_the_first_task(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('admin')}"}
    # what the JobSpec's schema forbids is refused by the Params (generated from it) before a run exists
    r = _post_run(airflow, headers, {"hyperparameters": {"epochs": -5}})
    assert r.status_code == 400 and "hyperparameters" in r.text and "minimum of 1" in r.text, r.text
    # a rule across fields is the first task's: the run fails there, naming the fields
    r = _post_run(airflow, headers, {"split": {"val_fraction": 0.6, "test_fraction": 0.5}})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    run = _wait_run(airflow, headers, run_id, seconds=300)
    assert run["state"] == "failed"
    tis = _task_instances(airflow, headers, run_id)
    assert tis["validate_spec"]["state"] == "failed"
    # close_sweep waits for whatever ends its trials had, and finds no sweep was planned: skipped
    assert tis["close_sweep"]["state"] == "skipped"
    assert {ti["state"] for t, ti in tis.items() if t not in ("validate_spec", "close_sweep")} == {"upstream_failed"}
    log = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/validate_spec/logs/1",
        headers={**headers, "Accept": "application/json"},
        timeout=10,
    )
    assert log.ok, log.text
    assert "invalid JobSpec" in log.text and "val_fraction + test_fraction must be < 1" in log.text


def test_a_user_outside_a_team_cannot_run_its_job(airflow):
    """bob (teams default and nlp) may not trigger team vision's own DAG (Airflow answers 403), nor run a
    vision job in his team's DAG: its first task fails, naming the team's DAG, before anything runs."""
    headers = {"Authorization": f"Bearer {airflow.token('bob')}"}
    conf = {"resources": {"team": "vision", "gpus_per_node": 1}}
    r = _post_run(airflow, headers, conf, dag_id="train_pipeline.vision")
    assert r.status_code == 403, r.text
    r = _post_run(airflow, headers, conf)
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    assert _wait_run(airflow, headers, run_id, seconds=300)["state"] == "failed"
    tis = _task_instances(airflow, headers, run_id)
    assert tis["validate_spec"]["state"] == "failed" and tis["train"]["state"] == "upstream_failed"
    log = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/validate_spec/logs/1",
        headers={**headers, "Accept": "application/json"},
        timeout=10,
    )
    assert "resources.team: 'vision' is not the team of train_pipeline.default" in log.text, log.text[-3000:]


def test_viewer_cannot_trigger(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('ann')}"}
    assert _post_run(airflow, headers).status_code == 403
