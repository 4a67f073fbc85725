"""The sandbox, sweeps, retraining and team ownership under Airflow's real executor: api-server, scheduler,
dag-processor and triggerers as processes, LocalExecutor, a task supervisor whose request socket is every
task process's stdin, admission waits deferred in the triggerer.

A trigger-only user's custom command looks for a way back to that supervisor (stdin, every inherited
descriptor) and asks it for a Variable and a Connection with Airflow's own frames; a built-in trainer's
workers are looked at from outside while they train. ``dag.test()`` runs the supervisor in-process, so
only a test through the executor can see what a child of a task holds. Then a sweep's trials as mapped
tasks, a retraining job file whose DAG the scheduler starts on new data, and only on new data, and what
belongs to a team. (The queue's own tests run on test_rest_api.py's Airflow: two Airflows, two workers.)
"""

import json
import os
import shutil
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
from dag_helpers import airflow_with_its_config, grid_order, require_the_sandbox, staged_version, trainyard_cli

import checkout
from datafiles import write_files
from webhook import webhook_receiver

REPO = Path(__file__).resolve().parents[2]
airflow_services = checkout.airflow_services()

pytestmark = pytest.mark.integration
# Each team triggers its own training DAG (Airflow's multi-team mode): tina's are team default's
DAG, VISION_DAG = "train_pipeline.default", "train_pipeline.vision"
INGEST, VISION_INGEST = "ingest_dataset.default", "ingest_dataset.vision"  # each team's own uploads
SECRET_VARIABLE, SECRET_VALUE = "warehouse_token", "s3cr3t-variable-value"
SECRET_CONNECTION, SECRET_PASSWORD = "warehouse_db", "s3cr3t-connection-password"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    require_the_sandbox()
    af = airflow_with_its_config(tmp_path_factory, airflow_services)
    af.env["TRAINYARD_TENSORBOARD_URL"] = "http://localhost:6006"  # as where an operator serves TensorBoard
    af.jobs_dir = tmp_path_factory.mktemp("jobs")  # retraining job files, read by the dag-processor
    af.env["TRAINYARD_JOBS_DIR"] = str(af.jobs_dir)
    # a folder on the tasks' sys.path: a package put there later is installed as far as they can tell
    af.site = tmp_path_factory.mktemp("worker_site")
    af.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(af.site), os.environ.get("PYTHONPATH")]))
    # tina may trigger runs and nothing more, in team default only; alice is of team vision (resources.yaml)
    af.setup(users="admin:admin,tina:user,alice:user")
    af.run("airflow", "variables", "set", SECRET_VARIABLE, SECRET_VALUE)
    af.run(
        "airflow", "connections", "add", SECRET_CONNECTION, "--conn-uri",
        f"postgresql://reader:{SECRET_PASSWORD}@db.internal:5432/warehouse",
    )  # fmt: skip
    af.start(teams=("default", "vision"))  # tina's and alice's: the other teams' triggerers would idle
    headers = af.headers("admin")
    af.wait(
        lambda: (
            requests.get(f"{af.url}/api/v2/dags/{DAG}", headers=headers, timeout=airflow_services.PATIENT_SECONDS).ok
        ),
        600,
        "the DAG",
    )
    yield af
    af.stop()


def test_a_custom_command_gets_nothing_from_the_supervisor(airflow):
    headers = airflow.headers("tina")
    script = REPO / "tests" / "fixtures" / "custom_channel_probe.py"
    run_id = airflow.trigger(
        DAG,
        {
            "name": "channel-probe",
            "recipe": "custom",
            "custom": {"command": [sys.executable, str(script), SECRET_VARIABLE, SECRET_CONNECTION]},
            "resources": {"gpus_per_node": 2, "gpu_type": "cpu"},
            "gates": [{"metric": "val_accuracy", "min": 0.8}],
        },
        headers,
    )
    run = airflow.wait_run(DAG, run_id, headers)
    assert run["state"] == "success", airflow.failure_report(DAG, run_id, headers)

    reports = sorted((airflow.trainyard_home / "runs" / "channel-probe").glob("*/work/channel-*.json"))
    assert len(reports) == 2, reports  # both workers looked
    for path in reports:
        report = json.loads(path.read_text())
        assert report["uid"] != 0
        assert not report["stdin_is_socket"] and report["descriptors"]["0"] == "/dev/null", report
        # stdout and stderr are the launcher's pipe; nothing else was handed down
        assert set(report["descriptors"]) == {"0", "1", "2"}, report
        assert all(target.startswith("pipe:") for fd, target in report["descriptors"].items() if fd != "0"), report
        assert set(report["asked"]) == {"0"}, report
        for answer in report["asked"]["0"].values():
            assert answer.startswith("OSError"), report  # /dev/null is no socket: nothing was sent
        text = json.dumps(report)
        assert SECRET_VALUE not in text and SECRET_PASSWORD not in text
    log = airflow.task_log(DAG, run_id, "train", headers)
    for secret in (SECRET_VALUE, SECRET_PASSWORD):
        assert secret not in log and secret[::-1] not in log


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _processes_of(path: str) -> list[int]:
    """The processes whose command line names ``path`` (a run's directory: its workers, its launcher)."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if path in " ".join(p.info["cmdline"] or [])]


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        chain.append(pid)
    return chain


def test_a_built_in_trainers_workers_hold_no_descriptor_of_the_supervisor(airflow):
    """Looked at from outside while they train: each worker's stdin is /dev/null, and none of its
    descriptors is a socket that an ancestor (the task process, its supervisor, the executor) holds. And
    the train task links its MLflow run and its curves while it trains, not only once it has ended."""
    import psutil

    headers = airflow.headers("tina")
    home = str(airflow.trainyard_home)
    seen: dict[int, dict] = {}
    links_while_training: dict[str, str | None] = {}
    stop = threading.Event()
    run_id = airflow.trigger(
        DAG,
        {
            "name": "built-in-probe",
            "hyperparameters": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1, "seed": 1},
            "resources": {"gpus_per_node": 2, "gpu_type": "cpu"},
            "gates": [],  # what is looked at here is the workers, not the model
        },
        headers,
    )
    links = f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/train/links"

    def watch() -> None:
        while not stop.wait(0.2) and len(seen) < 2:
            for p in psutil.process_iter(["cmdline"]):
                cmdline = " ".join(p.info["cmdline"] or [])
                if p.pid in seen or "trainyard.training.entry" not in cmdline or home not in cmdline:
                    continue
                try:
                    fds = {fd: os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")}
                    above = set().union(*(_socket_inodes(a) for a in _ancestors(p.pid)))
                except (OSError, StopIteration):
                    continue  # it ended meanwhile
                seen[p.pid] = {"fds": fds, "ancestors_sockets": above}
                if not links_while_training:  # a worker is training: so is the task
                    links_while_training.update(
                        requests.get(links, headers=headers, timeout=airflow_services.PATIENT_SECONDS).json()[
                            "extra_links"
                        ]
                    )

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = airflow.wait_run(DAG, run_id, headers)
    finally:
        stop.set()
        watcher.join()
    assert run["state"] == "success", airflow.failure_report(DAG, run_id, headers)
    assert len(seen) >= 2, seen  # both workers were caught training
    for pid, found in seen.items():
        assert found["fds"]["0"] == "/dev/null", (pid, found)
        assert found["ancestors_sockets"], found  # the task process's own channel is there to compare with
        assert not set(found["fds"].values()) & found["ancestors_sockets"], (pid, found)
    assert (links_while_training["MLflow run"] or "").startswith("http://localhost:5000/#/experiments/"), (
        links_while_training
    )
    assert (links_while_training["TensorBoard"] or "").startswith("http://localhost:6006/?runFilter=built-in-probe%2F")


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
        return requests.get(
            url, headers=headers, params={"map_index": map_index}, timeout=airflow_services.PATIENT_SECONDS
        ).json()["extra_links"]

    evaluated = links("evaluate")
    assert evaluated["MLflow run"].endswith(f"/runs/{version.run_id}"), evaluated
    assert evaluated["TensorBoard"].startswith("http://localhost:6006/?runFilter=sweep-digits%2F"), evaluated
    assert links("trial.train_trial", 0)["MLflow run"].startswith("http://localhost:5000/#/experiments/")

    # the trials' runs, found by a numeric condition that a comparison of the params as text gets wrong
    listed = trainyard_cli(
        airflow, "runs", "list", "--job", "sweep-digits", "--user", "tina", "--tag", "sweep.name=digits-lr",
        "--where", "hyperparameters.learning_rate < 0.001", "--format", "json", token=airflow.token("tina"),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert len(found) == len(bad) and {float(r["hyperparameters.learning_rate"]) for r in found} <= set(BAD)
    png = airflow.trainyard_home / "sweep-curves.png"
    compared = trainyard_cli(
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
        return requests.get(f"{api}/dags/{dag_id}", headers=headers, timeout=airflow_services.PATIENT_SECONDS).json()

    airflow.wait(lambda: "dag_id" in dag(), 300, "the job's DAG")

    def runs() -> list[dict]:
        r = requests.get(
            f"{api}/dags/{dag_id}/dagRuns",
            headers=headers,
            params={"order_by": "id"},
            timeout=airflow_services.PATIENT_SECONDS,
        )
        return r.json()["dag_runs"]

    def retrained(count: int, state: str = "success") -> dict:
        """The count-th run of the job's DAG, once it ended in ``state`` (as did the training run it
        started), and that training run's conf."""
        airflow.wait(lambda: len(runs()) >= count, 300, f"retraining run {count}")
        run = runs()[count - 1]
        ended = airflow.wait_run(dag_id, run["dag_run_id"], headers, 600)
        assert ended["state"] == state, airflow.failure_report(dag_id, run["dag_run_id"], headers)
        training = f"{dag_id}__{run['dag_run_id']}"
        r = requests.get(
            f"{api}/dags/{DAG}/dagRuns/{training}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
        )
        assert r.json()["state"] == state, airflow.failure_report(DAG, training, headers)
        return {"conf": r.json()["conf"], "run": training, "note": r.json()["note"]}

    def upload(folder: Path) -> dict:
        run_id = airflow.trigger(INGEST, {"folder": str(folder), "repo": "pets"}, headers)
        assert airflow.wait_run(INGEST, run_id, headers, 300)["state"] == "success"
        url = f"{api}/dags/{INGEST}/dagRuns/{run_id}/taskInstances/commit_upload/xcomEntries/return_value"
        return requests.get(url, headers=headers, timeout=airflow_services.PATIENT_SECONDS).json()["value"]

    def events(asset_id: int) -> int:
        r = requests.get(
            f"{api}/assets/events",
            headers=headers,
            params={"asset_id": asset_id},
            timeout=airflow_services.PATIENT_SECONDS,
        )
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
            training = retrained(1)
            assert training["conf"]["dataset"]["ref"] == first["commit"]
            # what Airflow's pages list the training run by
            assert training["note"] == "pets: digits_cnn on 1 x cpu, team default, retraining on new data"

            uri = dataset_uri("local", "pets", "main")
            r = requests.get(
                f"{api}/assets", headers=headers, params={"uri_pattern": uri}, timeout=airflow_services.PATIENT_SECONDS
            )
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
            assert (
                requests.post(
                    f"{api}/assets/events", headers=headers, json=event, timeout=airflow_services.PATIENT_SECONDS
                ).status_code
                == 200
            )
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
            cli = trainyard_cli(airflow, "data", "upload", str(write_files(tmp_path / "v2", changed)), "--repo", "pets",
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
    card = trainyard_cli(
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
        refused = trainyard_cli(airflow, "replay", "pets", "1", "--poll", "2", token=token, timeout=600)
    finally:
        shutil.rmtree(probe)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "dependency trainyard-replay-probe: not recorded -> 1.0" in refused.stderr, refused.stderr
    assert "train: failed" in refused.stderr, refused.stderr
    # here, as it trained: the same metrics, bit for bit (CPU), and nothing registered
    replayed = trainyard_cli(airflow, "replay", "pets", "1", "--poll", "2", token=token, timeout=600)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replay of pets version 1: reproduced" in replayed.stdout and "tolerance: 0 (absolute)" in replayed.stdout
    replay_run = replayed.stdout.splitlines()[0]
    assert "train: success" in replayed.stderr and f"run {DAG}/{replay_run}: success" in replayed.stderr
    states = {t: ti["state"] for t, ti in airflow.task_instances(DAG, replay_run, headers).items()}
    assert (states["gate"], states["export_onnx"], states["register"]) == ("success", "skipped", "skipped")
    replay_note = requests.get(
        f"{api}/dags/{DAG}/dagRuns/{replay_run}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
    ).json()["note"]
    assert replay_note == "pets: digits_cnn on 1 x cpu, team default, replay of pets:1", replay_note
    assert len(client.search_model_versions("name = 'pets'")) == 1

    # submitted from a job file and followed: a run that fails exits non-zero, naming where it failed
    broken = tmp_path / "broken.yaml"
    spec = {k: v for k, v in job.items() if k != "retrain_on"}  # a JobSpec file, not a job file
    broken.write_text(yaml.safe_dump({**spec, "name": "no-data", "dataset": {"repo": "nowhere", "source": "none"}}))
    followed = trainyard_cli(airflow, "submit", str(broken), "--wait", "--poll", "2", token=token, timeout=300)
    assert followed.returncode == 1, followed.stdout + followed.stderr
    assert "resolve_dataset: failed" in followed.stderr and ": failed (failed: resolve_dataset)" in followed.stderr
    status = trainyard_cli(airflow, "runs", "status", followed.stdout.strip(), "--json", token=token)
    assert json.loads(status.stdout)["tasks"]["resolve_dataset"]["state"] == "failed"


def _vision_model(airflow, monkeypatch, tmp_path, name: str) -> str:
    """A signed version of ``name``, owned by team vision and under its staging alias, in the executor's
    registry (as a vision job's register leaves one); its version number."""
    monkeypatch.setenv("TRAINYARD_HOME", str(airflow.trainyard_home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{airflow.trainyard_home / 'mlflow' / 'mlflow.db'}")
    return staged_version(name, "vision", tmp_path, user="alice")[1]


VISION_PROMOTE, TINA_PROMOTE = "promote_model.vision", "promote_model.default"  # each team's own


def _answer(airflow, run_id: str, user: str, option: str = "Approve") -> requests.Response:
    return requests.patch(
        f"{airflow.url}/api/v2/dags/{VISION_PROMOTE}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails",
        headers=airflow.headers(user),
        json={"chosen_options": [option], "params_input": {}},
        timeout=airflow_services.PATIENT_SECONDS,
    )


def test_a_model_belongs_to_its_team_and_only_its_promoters_move_or_approve(airflow, monkeypatch, tmp_path):
    """Two teams' users through the real api-server, scheduler and executor: tina (team default) can neither
    register into nor promote nor roll back vision's model (vision's own promote_model.vision is not hers to
    trigger; her team's refuses it); alice (vision) asks for production from the command line as her
    Airflow login, cannot approve her own request, nor can tina (HTTP 403); admin can."""
    from trainyard.registry.versions import History, alias_holder
    from trainyard.tracking import mlflow_tracking as mt

    name = "vision-net"
    version = _vision_model(airflow, monkeypatch, tmp_path, name)
    tina, alice, admin = airflow.headers("tina"), airflow.headers("alice"), airflow.headers("admin")

    # another team's job of the same name: refused by its first task, naming the owner, before data moves
    run = airflow.trigger(DAG, {"name": name, "resources": {"gpus_per_node": 1, "gpu_type": "cpu"}}, tina)
    assert airflow.wait_run(DAG, run, tina, 300)["state"] == "failed"
    states = {t: ti["state"] for t, ti in airflow.task_instances(DAG, run, tina).items()}
    assert states["validate_spec"] == "failed" and states["resolve_dataset"] in ("upstream_failed", None), states
    assert "model 'vision-net' belongs to team 'vision'" in airflow.task_log(DAG, run, "validate_spec", tina)

    # tina's promotion: vision's promote_model.vision is not hers to trigger (HTTP 403), her team's own
    # refuses it at verify, and so does the command line; nothing moved
    conf = {"model": name, "version": version, "reason": "mine now"}
    refused = requests.post(
        f"{airflow.url}/api/v2/dags/{VISION_PROMOTE}/dagRuns",
        headers=tina,
        json={"conf": conf},
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert refused.status_code == 403, refused.text
    run = airflow.trigger(TINA_PROMOTE, conf, tina)
    assert airflow.wait_run(TINA_PROMOTE, run, tina, 300)["state"] == "failed"
    assert "user 'tina' may not move aliases of model 'vision-net'" in airflow.task_log(
        TINA_PROMOTE, run, "verify", tina
    )
    back = trainyard_cli(
        airflow, "models", "rollback", name, "--alias", "staging", "--poll", "1", token=airflow.token("tina")
    )
    assert back.returncode == 1 and "may not use team 'vision''s promote_model.vision" in back.stderr, back.stderr

    # alice asks for production as her login; the team's policy makes it wait for another person
    asked = trainyard_cli(
        airflow, "models", "promote", name, version, "--reason", "launch", "--no-wait", token=airflow.token("alice")
    )
    assert asked.returncode == 0, asked.stderr
    run = asked.stdout.strip()
    airflow.wait(
        lambda: airflow.task_instances(VISION_PROMOTE, run, alice).get("approve", {}).get("state") == "awaiting_input",
        300,
        "the approval request",
    )
    # An answer the scheduler sees before the executor's word that the asking process ended fails the task
    # (Airflow 3.3: "finished with state success, but the task instance's state attribute is queued"): a
    # person takes longer than that; the test waits for the scheduler to have taken that word.
    ended = (
        "Received executor event with state success for task instance TaskInstanceKey("
        f"dag_id='{VISION_PROMOTE}', task_id='approve', run_id='{run}'"
    )
    airflow.wait(lambda: ended in (airflow.home / "scheduler.log").read_text(), 120, "the asking process to end")
    assert _answer(airflow, run, "alice").status_code == 403  # not her own request
    assert _answer(airflow, run, "tina").status_code == 403  # not another team's member
    approved = _answer(airflow, run, "admin")
    assert approved.status_code == 200, approved.text
    assert airflow.wait_run(VISION_PROMOTE, run, admin, 300)["state"] == "success"
    c = mt.client()
    assert alias_holder(c, name, "production") == version
    [moved] = History().entries(name, "production")
    assert (moved["user"], moved["approved_by"], moved["team"]) == ("alice", "admin", "vision")


def _another_team_reads_nothing_of(airflow, dag_id: str, run_id: str, *, owner: str, other: str) -> None:
    """``other``, of another team than ``owner``'s run, reads nothing of it through the REST API (what the
    UI calls too) or the command line, and cannot trigger its team's DAG; ``owner`` can read all of it."""
    api = f"{airflow.url}/api/v2"
    run = f"{api}/dags/{dag_id}/dagRuns/{run_id}"
    reads = [
        f"{api}/dags/{dag_id}",
        run,
        f"{run}/taskInstances",
        f"{run}/taskInstances/validate_spec/logs/1",
        f"{run}/taskInstances/validate_spec/xcomEntries/return_value",
    ]
    for url in reads:
        assert (
            requests.get(url, headers=airflow.headers(owner), timeout=airflow_services.PATIENT_SECONDS).status_code
            == 200
        ), url
        assert (
            requests.get(url, headers=airflow.headers(other), timeout=airflow_services.PATIENT_SECONDS).status_code
            == 403
        ), url
    for listing in (f"{api}/dags", f"{api}/dags/~/dagRuns", f"{api}/dags/~/dagRuns/~/taskInstances"):
        seen = requests.get(
            listing, headers=airflow.headers(other), params={"limit": 1000}, timeout=airflow_services.PATIENT_SECONDS
        ).text
        assert dag_id not in seen and run_id not in seen, listing
    refused = requests.post(
        f"{api}/dags/{dag_id}/dagRuns",
        headers=airflow.headers(other),
        json={"logical_date": None},
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert refused.status_code == 403, refused.text
    theirs = trainyard_cli(airflow, "runs", "status", run_id, "--json", token=airflow.token(owner))
    assert theirs.returncode == 0 and json.loads(theirs.stdout)["dag"] == dag_id, theirs.stderr
    mine = trainyard_cli(airflow, "runs", "status", run_id, token=airflow.token(other))
    assert mine.returncode == 1 and "no training run" in mine.stderr, mine.stderr
    # the queue shows the other team's job as team, GPUs and priority only
    queued = json.loads(trainyard_cli(airflow, "queue", "--json", token=airflow.token(other)).stdout)
    assert [{k: j[k] for k in ("team", "gpus")} for j in queued if "run" not in j] == [{"team": "vision", "gpus": 1}]


def _a_team_s_data_is_its_own(airflow, folder: Path, job: dict) -> str:
    """alice uploads ``folder`` through vision's own ``ingest_dataset.vision``: tina (team default) cannot see
    that DAG, its run or what it returned, trigger it, or read, tag or upload to the repository with the
    command line. Returns the run of tina's ``job`` on that repository, which the caller sees refused."""
    api, alice, tina = f"{airflow.url}/api/v2", airflow.headers("alice"), airflow.headers("tina")
    run_id = airflow.trigger(VISION_INGEST, {"folder": str(folder), "repo": "vision-pets"}, alice)
    ended = airflow.wait_run(VISION_INGEST, run_id, alice, 300)
    assert ended["state"] == "success", airflow.failure_report(VISION_INGEST, run_id, alice)
    run = f"{api}/dags/{VISION_INGEST}/dagRuns/{run_id}"
    for url in (f"{api}/dags/{VISION_INGEST}", run, f"{run}/taskInstances/commit_upload/xcomEntries/return_value"):
        assert requests.get(url, headers=alice, timeout=airflow_services.PATIENT_SECONDS).status_code == 200, url
        assert requests.get(url, headers=tina, timeout=airflow_services.PATIENT_SECONDS).status_code == 403, url
    refused = requests.post(
        f"{api}/dags/{VISION_INGEST}/dagRuns",
        headers=tina,
        json={"logical_date": None},
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert refused.status_code == 403, refused.text
    assert trainyard_cli(airflow, "data", "log", "--repo", "vision-pets", token=airflow.token("alice")).returncode == 0
    for command in (["log"], ["ls"], ["tag", "mine"], ["upload", str(folder), "--team", "default"]):
        said = trainyard_cli(airflow, "data", *command, "--repo", "vision-pets", token=airflow.token("tina"))
        assert said.returncode == 1 and "'vision-pets' belongs to team 'vision'" in said.stderr, (command, said.stderr)
    return airflow.trigger(DAG, {**job, "dataset": {"repo": "vision-pets", "source": "none"}}, tina)


def test_a_team_s_run_is_its_own_and_hogs_end_at_their_team_s_limits_while_it_works_on(airflow, tmp_path):
    """Two teams' users side by side under the real executor. alice's (team vision) job in vision's
    own train_pipeline.vision: tina (team default) reads nothing of it (HTTP 403, absent from every list,
    `trainyard runs status` finds no such run, `trainyard queue` shows its team and GPUs only). alice's
    dataset, uploaded through vision's own ingest_dataset.vision, is not tina's to see, read, tag, upload to
    or train on. Team default's policy limits its jobs to 64 processes and 1 GiB a slot: tina's fork bomb and
    memory hog, custom commands, each fail their task with a message naming the limit and where it is set,
    and alice's job, which starts a process and takes memory every half second, is still running after both."""
    import yaml

    from trainyard.data.classification import digits_files

    tina, alice = airflow.headers("tina"), airflow.headers("alice")
    resources = airflow.config_dir / "resources.yaml"
    good = resources.read_text()
    edited = yaml.safe_load(good)
    edited["teams"]["vision"]["policy"]["custom_commands"] = True  # for alice's job below
    resources.write_text(yaml.safe_dump(edited))
    edited["teams"]["default"]["policy"]["limits"] = {"cpus_per_slot": 1, "memory_gb_per_slot": 1, "processes": 64}
    one_cpu = {"gpus_per_node": 1, "gpu_type": "cpu"}
    # alice's job starts a process and takes 64 MiB every half second, and fails as soon as either is refused
    # (a training that long would keep a core busy for nothing)
    keeps_working = [sys.executable, str(REPO / "tests" / "fixtures" / "custom_keeps_working.py")]
    trains_on = None
    try:
        trains_on = airflow.trigger(
            VISION_DAG,
            {
                "name": "trains-on",
                "recipe": "custom",
                "custom": {"command": keeps_working},
                "resources": {**one_cpu, "team": "vision"},  # borrowing a CPU slot of team default's
                "gates": [],
            },
            alice,
        )
        airflow.wait(
            lambda: airflow.task_instances(VISION_DAG, trains_on, alice)["train"]["state"] == "running",
            300,
            "alice's job",
        )
        _another_team_reads_nothing_of(airflow, VISION_DAG, trains_on, owner="alice", other="tina")
        not_theirs = _a_team_s_data_is_its_own(
            airflow, write_files(tmp_path / "pets", digits_files()), {"name": "borrowed", "resources": one_cpu}
        )
        resources.write_text(yaml.safe_dump(edited))
        hogs = {
            what: airflow.trigger(
                DAG,
                {
                    "name": f"hog-{what}",
                    "recipe": "custom",
                    "custom": {"command": [sys.executable, str(REPO / "tests" / "fixtures" / "custom_hog.py"), what]},
                    "resources": one_cpu,
                    "gates": [],
                },
                tina,
            )
            for what in ("fork", "memory")
        }
        for what, run_id in hogs.items():
            assert airflow.wait_run(DAG, run_id, tina, 600)["state"] == "failed", what
            train = airflow.task_instances(DAG, run_id, tina)["train"]
            assert train["state"] == "failed" and train["try_number"] == 1, (what, train)  # no retry: it cannot help
        fork_log = airflow.task_log(DAG, hogs["fork"], "train", tina)
        assert "process limit 64 (teams.default.policy.limits.processes) reached" in fork_log, fork_log[-3000:]
        assert "forked 400 processes" not in fork_log
        memory_log = airflow.task_log(DAG, hogs["memory"], "train", tina)
        assert "memory limit 1 GiB (teams.default.policy.limits.memory_gb_per_slot 1 x 1 slot) reached" in memory_log, (
            memory_log[-3000:]
        )
        assert "held 3 GiB" not in memory_log
        assert airflow.wait_run(DAG, not_theirs, tina, 300)["state"] == "failed"
        refused = airflow.task_instances(DAG, not_theirs, tina)["resolve_dataset"]
        assert refused["state"] == "failed" and refused["try_number"] == 1, refused
        said = airflow.task_log(DAG, not_theirs, "resolve_dataset", tina)
        assert "repository 'vision-pets' belongs to team 'vision'; team 'default' may not read it" in said, said[-3000:]
        assert airflow.task_instances(VISION_DAG, trains_on, alice)["train"]["state"] == "running"  # it works on
    finally:
        resources.write_text(good)
        if trains_on is not None:
            requests.patch(
                f"{airflow.url}/api/v2/dags/{VISION_DAG}/dagRuns/{trains_on}",
                headers=alice,
                json={"state": "failed"},
                timeout=airflow_services.PATIENT_SECONDS,
            )
            # marked failed, its task is killed at its next heartbeat, and its processes with it
            airflow.wait(
                lambda: not _processes_of(str(airflow.trainyard_home / "runs" / "trains-on")),
                120,
                "alice's job to stop",
            )
