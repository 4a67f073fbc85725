"""Retraining job files under Airflow's real scheduler, executor and triggerer (its own Airflow, so that the
test suite can run it beside test_under_the_executor.py): a job's DAG started by new data and only new
data, skipped on what is registered or already stopped by its gate, the team's webhook, the model card,
replay, and a submitted run followed from the command line."""

import json
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
from executor_harness import DAG, airflow_under_the_executor, trainyard

from datafiles import write_files
from webhook import webhook_receiver

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    with airflow_under_the_executor(tmp_path_factory) as af:
        yield af


def test_a_job_file_retrains_on_each_new_commit_skips_what_is_registered_and_its_team_hears(airflow, tmp_path):
    """A job file with ``retrain_on: new_commits`` becomes a DAG. An upload through ``ingest_dataset`` starts
    exactly one retraining run on its commit, an identical upload none (no commit, no event); an event posted
    over REST for data and a spec already registered starts a run that trains nothing and says why. The job
    file is edited (a gate no model passes); ``trainyard data upload`` of new data starts a run on that commit
    which the gate stops before export (every check on its MLflow run). The team's webhook (an Airflow http
    connection, named in resources.yaml) receives exactly the new staging version and the gate's failure,
    with its table. Then the version's model card, its replay (refused in a changed environment, bit for bit
    otherwise) and a submitted run that fails."""
    import yaml
    from mlflow.tracking import MlflowClient

    from trainyard.data.classification import digits_files
    from trainyard.retraining import dataset_uri
    from trainyard.spec import SPEC_DIGEST_TAG

    headers = airflow.headers("admin")  # asset events need the op role
    api = f"{airflow.url}/api/v2"
    job = {
        "retrain_on": "new_commits",
        "name": "pets",
        "dataset": {"repo": "pets", "ref": "main", "source": "none"},
        "hyperparameters": {"epochs": 1, "batch_size": 32, "learning_rate": 0.1, "seed": 1},
        "resources": {"gpus_per_node": 1, "gpu_type": "cpu"},
        "gates": [{"metric": "val_accuracy", "min": 0.3}],
    }
    job_file = airflow.jobs_dir / "pets.yaml"
    job_file.write_text(yaml.safe_dump(job))
    dag_id = "retrain_pets"

    def dag() -> dict:
        return requests.get(f"{api}/dags/{dag_id}", headers=headers, timeout=10).json()

    airflow.wait(lambda: "dag_id" in dag(), 300, "the job's DAG")

    def runs() -> list[dict]:
        r = requests.get(f"{api}/dags/{dag_id}/dagRuns", headers=headers, params={"order_by": "id"}, timeout=10)
        return r.json()["dag_runs"]

    def retrained(count: int, state: str = "success") -> dict:
        """The count-th run of the job's DAG, once it ended in ``state`` (as did the training run it
        started), and that training run's conf."""
        airflow.wait(lambda: len(runs()) >= count, 300, f"retraining run {count}")
        run = runs()[count - 1]
        ended = airflow.wait_run(dag_id, run["dag_run_id"], headers, 600)
        assert ended["state"] == state, airflow.failure_report(dag_id, run["dag_run_id"], headers)
        training = f"{dag_id}__{run['dag_run_id']}"
        r = requests.get(f"{api}/dags/{DAG}/dagRuns/{training}", headers=headers, timeout=10)
        assert r.json()["state"] == state, airflow.failure_report(DAG, training, headers)
        return {"conf": r.json()["conf"], "run": training}

    def upload(folder: Path) -> dict:
        run_id = airflow.trigger("ingest_dataset", {"folder": str(folder), "repo": "pets"}, headers)
        assert airflow.wait_run("ingest_dataset", run_id, headers, 300)["state"] == "success"
        url = f"{api}/dags/ingest_dataset/dagRuns/{run_id}/taskInstances/commit_upload/xcomEntries/return_value"
        return requests.get(url, headers=headers, timeout=10).json()["value"]

    def events(asset_id: int) -> int:
        r = requests.get(f"{api}/assets/events", headers=headers, params={"asset_id": asset_id}, timeout=10)
        return r.json()["total_entries"]

    resources = airflow.config_dir / "resources.yaml"
    before = resources.read_text()
    with webhook_receiver() as (port, received):
        airflow.run(
            "airflow", "connections", "add", "team_webhook", "--conn-type", "http",
            "--conn-host", "127.0.0.1", "--conn-port", str(port), "--conn-schema", "http",
        )  # fmt: skip
        fleet = yaml.safe_load(before)
        fleet["teams"]["default"]["notify"] = ["team_webhook"]
        resources.write_text(yaml.safe_dump(fleet))
        try:
            files = digits_files()
            first = upload(write_files(tmp_path / "v1", files))
            assert first["new_commit"]
            assert retrained(1)["conf"]["dataset"]["ref"] == first["commit"]

            uri = dataset_uri("local", "pets", "main")
            r = requests.get(f"{api}/assets", headers=headers, params={"uri_pattern": uri}, timeout=10)
            (asset,) = r.json()["assets"]
            assert events(asset["id"]) == 1
            same = upload(write_files(tmp_path / "v1-again", files))
            assert (same["commit"], same["new_commit"]) == (first["commit"], False)
            assert events(asset["id"]) == 1 and len(runs()) == 1  # no commit, no event: nothing can start a run

            client = MlflowClient(f"sqlite:///{airflow.trainyard_home / 'mlflow' / 'mlflow.db'}")
            (version,) = client.search_model_versions("name = 'pets'")
            assert version.tags["dataset.commit"] == first["commit"] and len(version.tags[SPEC_DIGEST_TAG]) == 64

            # an event posted over REST (as a lakeFS hook or a data pipeline would) for the commit just trained:
            # the run it starts trains nothing and names the version that holds that commit and spec
            event = {"asset_id": asset["id"], "extra": {"commit": first["commit"]}}
            assert requests.post(f"{api}/assets/events", headers=headers, json=event, timeout=10).status_code == 200
            airflow.wait(lambda: len(runs()) == 2, 300, "the run of the REST event")
            skipped = runs()[1]["dag_run_id"]
            assert airflow.wait_run(dag_id, skipped, headers, 300)["state"] == "success"
            states = {t: ti["state"] for t, ti in airflow.task_instances(dag_id, skipped, headers).items()}
            assert states == {"pin_commit": "skipped", "train": "skipped"}, states
            log = airflow.task_log(dag_id, skipped, "pin_commit", headers)
            assert f"pets version 1 was trained on commit {first['commit'][:12]}" in log

            # the job file edited: once the DAG is parsed again, new data from the command line (its event
            # posted with Airflow's REST client) trains under the new gate, which stops it
            edited = time.time()
            impossible = [{"metric": "val_accuracy", "max": -1.0}, {"metric": "val_macro_f1", "min": 0.9999}]
            job_file.write_text(yaml.safe_dump({**job, "gates": impossible}))
            airflow.wait(
                lambda: datetime.fromisoformat(dag()["last_parsed_time"]).timestamp() > edited + 1, 300, "a new parse"
            )
            changed = {**files, "images/digits-00007.npy": files["images/digits-00008.npy"]}
            cli = trainyard(airflow, "data", "upload", str(write_files(tmp_path / "v2", changed)), "--repo", "pets",
                             token=airflow.token("admin"))  # fmt: skip
            assert cli.returncode == 0, cli.stderr
            second = cli.stdout.strip()
            assert f"announced commit {second[:12]} on {asset['uri']}" in cli.stderr
            gated = retrained(3, "failed")
            assert gated["conf"]["dataset"]["ref"] == second
            states = {t: ti["state"] for t, ti in airflow.task_instances(DAG, gated["run"], headers).items()}
            assert (states["train"], states["gate"]) == ("success", "failed")
            assert (states["export_onnx"], states["register"]) == ("upstream_failed", "upstream_failed")
            # the verdict, with every check, is on the MLflow run: why this run has no model version
            (run,) = client.search_runs(
                [client.get_experiment_by_name("pets").experiment_id],
                f"tags.`trainyard.run_key` = '{DAG}/{gated['run']}'",
            )
            assert run.data.tags["gate.passed"] == "false"
            assert run.data.tags["gate.threshold.val_macro_f1"].startswith("FAIL: value=")
            assert len(client.search_model_versions("name = 'pets'")) == 1
        finally:
            resources.write_text(before)
    assert [n["kind"] for n in received] == ["new_version", "gate_failed"], received
    staged, blocked = received
    assert (staged["model"], staged["version"], staged["alias"], staged["team"]) == ("pets", "1", "staging", "default")
    assert (blocked["job"], blocked["run"], blocked["team"]) == ("pets", f"{DAG}/{gated['run']}", "default")
    assert [c["metric"] for c in blocked["gate"]["checks"] if not c["passed"]] == ["val_accuracy", "val_macro_f1"]
    assert "val_accuracy" in blocked["text"] and "FAILED by" in blocked["text"]

    # the model card of the version, stored with its run at registration
    card = trainyard(airflow, "models", "card", "pets", "1", "--out", str(tmp_path / "cards"))
    assert card.returncode == 0, card.stderr
    written = json.loads((tmp_path / "cards" / "pets-v1" / "card.json").read_text())
    assert written["lineage"]["dataset"]["commit"] == first["commit"] and written["aliases"] == ["staging"]
    assert written["lineage"]["spec"]["dataset"]["ref"] == first["commit"] and written["gate"]["passed"] is True
    assert written["signature"]["signed"] and written["cost"]["queue_wait_seconds"] is not None

    # replayed where one more package is installed than when it trained: refused, naming it
    probe = tmp_path / "site" / "trainyard_replay_probe-1.0.dist-info"
    probe.mkdir(parents=True)
    (probe / "METADATA").write_text("Metadata-Version: 2.1\nName: trainyard-replay-probe\nVersion: 1.0\n")
    token = airflow.token("tina")
    refused = trainyard(airflow, "replay", "pets", "1", token=token, env={"PYTHONPATH": str(probe.parent)})
    assert refused.returncode == 1 and "dependency trainyard-replay-probe: not recorded -> 1.0" in refused.stderr
    # here, as it trained: the same metrics, bit for bit (CPU), and nothing registered
    replayed = trainyard(airflow, "replay", "pets", "1", "--poll", "2", token=token, timeout=600)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replay of pets version 1: reproduced" in replayed.stdout and "tolerance: 0 (absolute)" in replayed.stdout
    replay_run = replayed.stdout.splitlines()[0]
    assert "train: success" in replayed.stderr and f"run {DAG}/{replay_run}: success" in replayed.stderr
    states = {t: ti["state"] for t, ti in airflow.task_instances(DAG, replay_run, headers).items()}
    assert (states["gate"], states["export_onnx"], states["register"]) == ("success", "skipped", "skipped")
    assert len(client.search_model_versions("name = 'pets'")) == 1

    # submitted from a job file and followed: a run that fails exits non-zero, naming where it failed
    broken = tmp_path / "broken.yaml"
    spec = {k: v for k, v in job.items() if k != "retrain_on"}  # a JobSpec file, not a job file
    broken.write_text(yaml.safe_dump({**spec, "name": "no-data", "dataset": {"repo": "nowhere", "source": "none"}}))
    followed = trainyard(airflow, "submit", str(broken), "--wait", "--poll", "2", token=token, timeout=300)
    assert followed.returncode == 1, followed.stdout + followed.stderr
    assert "resolve_dataset: failed" in followed.stderr and ": failed (failed: resolve_dataset)" in followed.stderr
    status = trainyard(airflow, "runs", "status", followed.stdout.strip(), "--json", token=token)
    assert json.loads(status.stdout)["tasks"]["resolve_dataset"]["state"] == "failed"
