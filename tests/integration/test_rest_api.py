"""Users' ways in through the Airflow REST API, under the real executor (tests/integration/
executor_airflow.py: api-server, scheduler, dag-processor and triggerers as processes, LocalExecutor).

Trigger train_pipeline with a conf and wait for success; trigger it with a conf its Params refuse (400)
and with one only the JobSpec refuses and see the first task fail naming the fields; no token -> 401; a
viewer cannot trigger (403); a user may trigger but not run the job of a team they are not in. Then a
sweep's trials as mapped tasks of the real scheduler, and a retraining job file whose DAG the scheduler
starts on new data, and only on new data. An Airflow of its own: test_under_the_executor.py's runs beside it.
"""

import json
import re
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
from dag_helpers import grid_order
from executor_airflow import DAG, INGEST, started, trainyard

import checkout
from datafiles import write_files
from webhook import webhook_receiver

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    yield from started(tmp_path_factory)


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


# A sweep whose order is known: the grid's first two points (trained side by side) are good learning rates,
# so every bad one starts after a good trial completed and the median pruner must stop it at epoch 1.
GOOD, BAD = (0.05, 0.1, 0.03), (2e-05, 1e-05, 3e-05)
SWEEP = {
    "name": "digits-lr",
    "trials": 6,
    "parallelism": 2,
    "sampler": "grid",
    "seed": 5,
    "pruner": "median",
    "startup_trials": 1,
    "warmup_epochs": 1,
    "parameters": [{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [*GOOD, *BAD]}],
}


def _sweep_study(airflow, name: str):
    import optuna

    path = airflow.trainyard_home / "sweeps" / "default" / "studies.journal"
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(path))))


def test_a_sweep_prunes_losers_survives_a_killed_worker_registers_the_best_and_resumes(airflow):
    """Six trials of the digits recipe, two at a time through the queue, each a mapped task of the real
    scheduler: the pruner stops the bad learning rates at their first reporting point, a trial whose worker
    is SIGKILLed ends FAIL (its task's retry trains a new trial), the best is registered with its values;
    triggered again under its name, the sweep adds trials to the same study."""
    import optuna
    import psutil
    from mlflow.tracking import MlflowClient

    from trainyard.sweeps.study import FAILED_ATTR

    assert set(grid_order([*GOOD, *BAD], SWEEP["seed"], 2)) <= set(GOOD)  # the premise of the pruning
    headers = airflow.headers("tina")
    spec = {
        "name": "sweep-digits",
        "hyperparameters": {"epochs": 6, "batch_size": 16, "seed": 5},
        "resources": {"gpus_per_node": 1, "gpu_type": "cpu"},
        "distributed": {"max_restarts": 0},  # a killed worker fails the try (torchrun would restart it)
        "gates": [{"metric": "val_accuracy", "min": 0.8}],
        "sweep": SWEEP,
    }
    run_id = airflow.trigger(DAG, spec, headers)
    runs = airflow.trainyard_home / "runs" / "sweep-digits"
    killed: dict = {}
    stop = threading.Event()

    def kill_one_good_trial() -> None:
        """The first good trial after the first two, once it has reported its first epoch: SIGKILL its worker."""
        while not stop.wait(0.02) and not killed:
            for reports in runs.glob("*_trial-*/work/trial_reports.jsonl"):
                number = int(reports.parent.parent.name.rsplit("-", 1)[1])
                config = json.loads((reports.parent.parent / "run_config.json").read_text())
                if number < 2 or config["spec"]["hyperparameters"]["learning_rate"] not in GOOD:
                    continue
                if not reports.read_text().strip():
                    continue
                for p in psutil.process_iter(["cmdline"]):
                    cmdline = " ".join(p.info["cmdline"] or [])
                    worker = "trainyard.training.entry" in cmdline and "torch.distributed.run" not in cmdline
                    if worker and str(reports.parent.parent) in cmdline:
                        p.kill()
                        killed.update(trial=number, pid=p.pid)
                        return

    watcher = threading.Thread(target=kill_one_good_trial, daemon=True)
    watcher.start()
    try:
        run = airflow.wait_run(DAG, run_id, headers, 900)
    finally:
        stop.set()
        watcher.join()
    assert run["state"] == "success", airflow.failure_report(DAG, run_id, headers)
    assert killed, "no good trial after the first two was seen training"

    study = _sweep_study(airflow, "digits-lr")
    trials = study.get_trials(deepcopy=False)
    # a trial that failed says why (the end of its error), for a failure of this test to explain itself
    states = {
        t.number: (t.state, t.user_attrs.get(FAILED_ATTR, "")[-1500:])
        if t.state == optuna.trial.TrialState.FAIL and t.number != killed.get("trial")
        else t.state
        for t in trials
    }
    assert trials[killed["trial"]].state == optuna.trial.TrialState.FAIL, states
    assert optuna.trial.TrialState.RUNNING not in [t.state for t in trials], states
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    bad = [t for t in trials if t.params["hyperparameters.learning_rate"] in BAD]
    assert len(bad) >= 3 and all(t.state == optuna.trial.TrialState.PRUNED for t in bad), states
    # the bad ones stopped at the first reporting point; a good one may be stopped later, when it falls below
    # the median of the completed trials at some epoch (the pruner's rule, not a fault)
    assert all(max(t.intermediate_values) == 1 for t in bad), {t.number: t.intermediate_values for t in bad}
    for t in pruned:  # their checkpoints were removed with them
        work = next(runs.glob(f"*_trial-{t.number}")) / "work"
        assert not (work / "checkpoints").exists() and not (work / "model.pt").exists()
    # every slot ended: the killed one's retry trained a new trial (7 trials for 6 slots)
    assert len(trials) == 7 and sum(t.state == optuna.trial.TrialState.FAIL for t in trials) == 1, states
    tis = airflow.task_instances(DAG, run_id, headers)
    slots = [ti for key, ti in tis.items() if key.startswith("trial.train_trial[")]
    assert len(slots) == 6 and {ti["state"] for ti in slots} == {"success"}
    assert sorted(ti["try_number"] for ti in slots) == [1, 1, 1, 1, 1, 2]

    best = study.best_trial
    c = MlflowClient(f"sqlite:///{airflow.trainyard_home / 'mlflow' / 'mlflow.db'}")
    version = c.get_model_version_by_alias("sweep-digits", "staging")
    assert version.tags["sweep.trial"] == str(best.number), version.tags
    assert json.loads(version.tags["params"])["learning_rate"] == best.params["hyperparameters.learning_rate"]
    # the data validation that gated the sweep run is on the version's run (the trial's), for its card
    assert "data_validation/validation.json" in {a.path for a in c.list_artifacts(version.run_id, "data_validation")}
    # MLflow shows how each trial's run ended: finished, stopped by the pruner (KILLED), or failed
    experiment = c.get_experiment_by_name("sweep-digits").experiment_id
    status = {
        int(r.data.tags["sweep.trial"]): r.info.status
        for r in c.search_runs([experiment], "tags.`sweep.name` = 'digits-lr'", max_results=100)
        if "sweep.trial" in r.data.tags
    }
    expected = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
    assert status == {n: expected[s.name] for n, s in states.items()}, (status, states)
    summary = c.search_runs([c.get_experiment_by_name("sweep-digits").experiment_id], "tags.`sweep.summary` = 'true'")
    assert len(summary) == 1 and summary[0].data.params["best.hyperparameters.learning_rate"] == str(
        best.params["hyperparameters.learning_rate"]
    )
    assert {"sweep/parallel_coordinates.png", "sweep/trials.csv"} <= {
        a.path for a in c.list_artifacts(summary[0].info.run_id, "sweep")
    }

    # the UI's links from the evaluation and from each trial to its MLflow run and its curves
    def links(task_id: str, map_index: int = -1) -> dict:
        url = f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/links"
        return requests.get(url, headers=headers, params={"map_index": map_index}, timeout=10).json()["extra_links"]

    evaluated = links("evaluate")
    assert evaluated["MLflow run"].endswith(f"/runs/{version.run_id}"), evaluated
    assert evaluated["TensorBoard"].startswith("http://localhost:6006/?runFilter=sweep-digits%2F"), evaluated
    assert links("trial.train_trial", 0)["MLflow run"].startswith("http://localhost:5000/#/experiments/")

    # the trials' runs, found by a numeric condition that a comparison of the params as text gets wrong
    listed = trainyard(
        airflow, "runs", "list", "--job", "sweep-digits", "--user", "tina", "--tag", "sweep.name=digits-lr",
        "--where", "hyperparameters.learning_rate < 0.001", "--format", "json", token=airflow.token("tina"),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert len(found) == len(bad) and {float(r["hyperparameters.learning_rate"]) for r in found} <= set(BAD)
    png = airflow.trainyard_home / "sweep-curves.png"
    compared = trainyard(
        airflow, "runs", "compare", "--job", "sweep-digits", "--tag", "sweep.name=digits-lr",
        "--curves", "val_accuracy,train_loss", "--png", str(png), token=airflow.token("tina"),
    )  # fmt: skip
    assert compared.returncode == 0 and "* hyperparameters.learning_rate" in compared.stdout, compared.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # every point of the grid is trained: the study goes on with another sampler
    again = airflow.trigger(DAG, {**spec, "sweep": {**SWEEP, "sampler": "random", "trials": 1}}, headers)
    assert airflow.wait_run(DAG, again, headers, 600)["state"] == "success", airflow.failure_report(DAG, again, headers)
    resumed = _sweep_study(airflow, "digits-lr").get_trials(deepcopy=False)
    assert len(resumed) == 8 and [t.number for t in resumed[:7]] == [t.number for t in trials]


def test_a_job_file_retrains_on_each_new_commit_skips_what_is_registered_and_its_team_hears(airflow, tmp_path):
    """A job file with ``retrain_on: new_commits`` becomes a DAG. An upload through ``ingest_dataset.default`` starts
    exactly one retraining run on its commit, an identical upload none (no commit, no event); an event posted
    over REST for data and a spec already registered starts a run that trains nothing and says why. The job
    file is edited (a gate no model passes); ``trainyard data upload`` of new data starts a run on that commit
    which the gate stops before export (every check on its MLflow run). The team's webhook (an Airflow http
    connection, named in resources.yaml) receives exactly the new staging version, the edited job's training
    running past its expected hours, and the gate's failure, with its table. Then the version's model card,
    its replay (refused in a changed environment, bit for bit otherwise) and a submitted run that fails."""
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
    airflow.parse("team-default")  # the test's Airflow parses its files only at start (QUIETER_FOR_TESTS)
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
        run_id = airflow.trigger(INGEST, {"folder": str(folder), "repo": "pets"}, headers)
        assert airflow.wait_run(INGEST, run_id, headers, 300)["state"] == "success"
        url = f"{api}/dags/{INGEST}/dagRuns/{run_id}/taskInstances/commit_upload/xcomEntries/return_value"
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
            # and a training expected to take 0.36 s: its team hears, from the training task, that it takes longer
            quick = {**job["resources"], "expected_hours": 0.0001}
            job_file.write_text(yaml.safe_dump({**job, "gates": impossible, "resources": quick}))
            airflow.parse("team-default")
            airflow.wait(
                lambda: datetime.fromisoformat(dag()["last_parsed_time"]).timestamp() > edited, 300, "a new parse"
            )
            changed = {**files, "images/digits-00007.npy": files["images/digits-00008.npy"]}
            cli = trainyard(airflow, "data", "upload", str(write_files(tmp_path / "v2", changed)), "--repo", "pets",
                             "--team", "default", token=airflow.token("admin"))  # fmt: skip
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
    assert [n["kind"] for n in received] == ["new_version", "long_training", "gate_failed"], received
    staged, long, blocked = received
    assert (long["run"], long["expected_hours"], long["team"]) == (f"{DAG}/{gated['run']}", 0.0001, "default")
    assert (staged["model"], staged["version"], staged["alias"], staged["team"]) == ("pets", "1", "staging", "default")
    assert (blocked["job"], blocked["run"], blocked["team"]) == ("pets", f"{DAG}/{gated['run']}", "default")
    assert [c["metric"] for c in blocked["gate"]["checks"] if not c["passed"]] == ["val_accuracy", "val_macro_f1"]
    assert "val_accuracy" in blocked["text"] and "FAILED by" in blocked["text"]

    # the model card of the version, stored with its run at registration
    card = trainyard(
        airflow, "models", "card", "pets", "1", "--out", str(tmp_path / "cards"), token=airflow.token("tina")
    )
    assert card.returncode == 0, card.stderr
    written = json.loads((tmp_path / "cards" / "pets-v1" / "card.json").read_text())
    assert written["lineage"]["dataset"]["commit"] == first["commit"] and written["aliases"] == ["staging"]
    assert written["owner"] == "default"  # the team whose job first registered it
    assert written["lineage"]["spec"]["dataset"]["ref"] == first["commit"] and written["gate"]["passed"] is True
    assert written["signature"]["signed"] and written["cost"]["queue_wait_seconds"] is not None

    # replayed on a worker where one more package is installed than when it trained: its training task
    # refuses, naming it (the environment the command is typed in does not count)
    probe = airflow.site / "trainyard_replay_probe-1.0.dist-info"
    probe.mkdir()
    (probe / "METADATA").write_text("Metadata-Version: 2.1\nName: trainyard-replay-probe\nVersion: 1.0\n")
    token = airflow.token("tina")
    try:
        refused = trainyard(airflow, "replay", "pets", "1", "--poll", "2", token=token, timeout=600)
    finally:
        shutil.rmtree(probe)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "dependency trainyard-replay-probe: not recorded -> 1.0" in refused.stderr, refused.stderr
    assert "train: failed" in refused.stderr, refused.stderr
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
