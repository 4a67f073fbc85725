"""The sandbox, the queue and team ownership under Airflow's real executor (tests/integration/
executor_airflow.py: api-server, scheduler, dag-processor and triggerers as processes, LocalExecutor, a task
supervisor whose request socket is every task process's stdin, admission waits deferred in the triggerer).

A trigger-only user's custom command looks for a way back to that supervisor (stdin, every inherited
descriptor) and asks it for a Variable and a Connection with Airflow's own frames; a built-in trainer's
workers are looked at from outside while they train. ``dag.test()`` runs the supervisor in-process, so
only a test through the executor can see what a child of a task holds. Then the queue: a run that fails
before training never queues, and a job waiting in the triggerer behind one that fails on its last try
starts within one look, through an edit that broke resources.yaml meanwhile; ``trainyard queue`` says why a
job waits. Then what belongs to a team: its models (who moves or approves), its runs, logs and data, and
the limits a job's processes are held to. Sweeps, retraining and the REST API's own checks are in
test_rest_api.py, against an Airflow of their own, so that the two files run side by side.
"""

import json
import os
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
import requests
from dag_helpers import staged_version
from executor_airflow import (
    DAG,
    REPO,
    SECRET_CONNECTION,
    SECRET_PASSWORD,
    SECRET_VALUE,
    SECRET_VARIABLE,
    VISION_DAG,
    VISION_INGEST,
    started,
    trainyard,
)

from datafiles import write_files

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    yield from started(tmp_path_factory)


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
    descriptors is a socket that an ancestor (the task process, its supervisor, the executor) holds."""
    import psutil

    headers = airflow.headers("tina")
    home = str(airflow.trainyard_home)
    seen: dict[int, dict] = {}
    stop = threading.Event()

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

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
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


def _ended(ti: dict) -> datetime:
    return datetime.fromisoformat(ti["end_date"])


def test_the_queue_keeps_moving_through_failures_and_a_broken_edit(airflow):
    """Both jobs want the fleet's two cpu slots. A run whose dataset ref does not resolve fails there and
    never asks for them. A custom command that fails on both of its tries holds them while it runs; the
    job behind it waits deferred in the triggerer, through a typo in resources.yaml (the last good file
    stays in force, the triggerer's log says what is wrong), and is admitted within one look of the final
    failure, not after the lease kept for a retry that will not come."""
    headers = airflow.headers("tina")
    gpus = {"gpus_per_node": 2, "gpu_type": "cpu"}
    bad_ref = airflow.trigger(
        DAG, {"name": "bad-ref", "dataset": {"ref": "no-such-branch"}, "resources": gpus}, headers
    )
    assert airflow.wait_run(DAG, bad_ref, headers, 300)["state"] == "failed"
    tis = airflow.task_instances(DAG, bad_ref, headers)
    assert tis["resolve_dataset"]["state"] == "failed"
    assert tis["admit"]["state"] == "upstream_failed" and tis["train"]["state"] == "upstream_failed"

    fails = airflow.trigger(
        DAG,
        # each try runs 20 s, long enough for the next job to reach admit and wait behind it
        {"name": "fails", "recipe": "custom",
         "custom": {"command": [sys.executable, "-c", "import time; time.sleep(20); raise SystemExit(3)"]},
         "resources": gpus},
        headers,
    )  # fmt: skip
    airflow.wait(
        lambda: airflow.task_instances(DAG, fails, headers)["train"]["state"] in ("running", "up_for_retry", "failed"),
        300,
        "the failing job's training",
    )
    waits = airflow.trigger(
        DAG,
        {
            "name": "waits",
            "hyperparameters": {"epochs": 2, "batch_size": 32, "seed": 1},
            "resources": gpus,
            "gates": [],
        },
        headers,
    )
    resources = airflow.config_dir / "resources.yaml"
    good = resources.read_text()
    try:
        airflow.wait(
            lambda: airflow.task_instances(DAG, waits, headers)["admit"]["state"] == "deferred",
            300,
            "the second job to wait for admission in the triggerer",
        )
        resources.write_text(good.replace("count: 2", "count: two", 1))  # an operator's typo
        assert airflow.wait_run(DAG, fails, headers, 300)["state"] == "failed"
        failed = airflow.task_instances(DAG, fails, headers)["train"]
        assert failed["try_number"] == 2  # its retry ran, and failed too: the final try
        assert airflow.wait_run(DAG, waits, headers, 300)["state"] == "success", airflow.failure_report(
            DAG, waits, headers
        )
    finally:
        resources.write_text(good)
    admitted = airflow.task_instances(DAG, waits, headers)["admit"]
    poll_s = 10  # scheduling.admission_poll_seconds, its default
    # within one look and the scheduler's own latency; kept for a retry, it would have been 600 s
    assert (_ended(admitted) - _ended(failed)).total_seconds() < poll_s + 30, (admitted, failed)
    log = airflow.task_log(DAG, waits, "admit", headers)  # the trigger's lines are in its task's log
    assert "gpu_types.cpu.count" in log and "the queue keeps the last good version" in log, log[-3000:]


def test_trainyard_queue_shows_why_a_job_waits_and_its_user_cancels_it(airflow):
    """What users ask first when a job does not start: `trainyard queue` says who holds the slots and why
    the job waits, in the admit task's words, to the team's members (another team's user sees team, GPUs
    and priority); `trainyard queue cancel` ends the waiting run through Airflow's API (as the user the
    token names) and frees its place at once."""
    headers = airflow.headers("tina")
    gpus = {"gpus_per_node": 2, "gpu_type": "cpu"}
    holder = airflow.trigger(
        DAG,
        {"name": "holder", "recipe": "custom", "resources": gpus,
         "custom": {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}},
        headers,
    )  # fmt: skip
    try:
        airflow.wait(
            lambda: airflow.task_instances(DAG, holder, headers)["train"]["state"] == "running",
            300,
            "the first job to hold the slots",
        )
        waiting = airflow.trigger(DAG, {"name": "waiting", "resources": gpus, "gates": []}, headers)
        airflow.wait(
            lambda: airflow.task_instances(DAG, waiting, headers)["admit"]["state"] == "deferred",
            300,
            "the second job to wait for admission",
        )
        shown = trainyard(airflow, "queue", "--json", token=airflow.token("tina"))
        assert shown.returncode == 0, shown.stderr
        jobs = {j["run"]: j for j in json.loads(shown.stdout)}
        # nobody logged in sees how much of the fleet a job asks for, not what or whose (another team's member
        # neither: the fork bomb test shows it)
        nobody = {"AIRFLOW_API_TOKEN": "", "XDG_CONFIG_HOME": str(airflow.trainyard_home / "no-login")}
        others = trainyard(airflow, "queue", "--json", env=nobody)
        assert others.returncode == 0, others.stderr
        assert (
            {"gpu_type": "cpu", "state": "waiting", "team": "default", "gpus": 2, "priority": 1}
            in json.loads(others.stdout)
            and "tina" not in others.stdout
            and waiting not in others.stdout
        ), others.stdout
        first, second = jobs[f"{DAG}/{holder}"], jobs[f"{DAG}/{waiting}"]
        assert (first["state"], first["user"], first["gpus"]) == ("admitted", "tina", 2)
        assert (second["state"], second["user"]) == ("waiting", "tina")
        assert second["reason"] == "cpu: 2 of 2 slots in use, the job needs 2"
        log = airflow.task_log(DAG, waiting, "admit", headers)
        assert second["reason"] in log  # the same words

        done = trainyard(airflow, "queue", "cancel", waiting, token=airflow.token("tina"))
        assert done.returncode == 0, done.stderr
        assert airflow.wait_run(DAG, waiting, headers, 120)["state"] == "failed"
        left = {j["run"] for j in json.loads(trainyard(airflow, "queue", "--json", token=airflow.token("tina")).stdout)}
        assert f"{DAG}/{waiting}" not in left and f"{DAG}/{holder}" in left
    finally:  # clean-up: the module's next test (if any) gets the slots back
        trainyard(airflow, "queue", "cancel", holder, token=airflow.token("admin"))
        airflow.wait_run(DAG, holder, headers, 120)


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
        timeout=30,
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
        f"{airflow.url}/api/v2/dags/{VISION_PROMOTE}/dagRuns", headers=tina, json={"conf": conf}, timeout=30
    )
    assert refused.status_code == 403, refused.text
    run = airflow.trigger(TINA_PROMOTE, conf, tina)
    assert airflow.wait_run(TINA_PROMOTE, run, tina, 300)["state"] == "failed"
    assert "user 'tina' may not move aliases of model 'vision-net'" in airflow.task_log(
        TINA_PROMOTE, run, "verify", tina
    )
    back = trainyard(
        airflow, "models", "rollback", name, "--alias", "staging", "--poll", "1", token=airflow.token("tina")
    )
    assert back.returncode == 1 and "may not use team 'vision''s promote_model.vision" in back.stderr, back.stderr

    # alice asks for production as her login; the team's policy makes it wait for another person
    asked = trainyard(
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
        assert requests.get(url, headers=airflow.headers(owner), timeout=30).status_code == 200, url
        assert requests.get(url, headers=airflow.headers(other), timeout=30).status_code == 403, url
    for listing in (f"{api}/dags", f"{api}/dags/~/dagRuns", f"{api}/dags/~/dagRuns/~/taskInstances"):
        seen = requests.get(listing, headers=airflow.headers(other), params={"limit": 1000}, timeout=30).text
        assert dag_id not in seen and run_id not in seen, listing
    refused = requests.post(
        f"{api}/dags/{dag_id}/dagRuns", headers=airflow.headers(other), json={"logical_date": None}, timeout=30
    )
    assert refused.status_code == 403, refused.text
    theirs = trainyard(airflow, "runs", "status", run_id, "--json", token=airflow.token(owner))
    assert theirs.returncode == 0 and json.loads(theirs.stdout)["dag"] == dag_id, theirs.stderr
    mine = trainyard(airflow, "runs", "status", run_id, token=airflow.token(other))
    assert mine.returncode == 1 and "no training run" in mine.stderr, mine.stderr
    # the queue shows the other team's job as team, GPUs and priority only
    queued = json.loads(trainyard(airflow, "queue", "--json", token=airflow.token(other)).stdout)
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
        assert requests.get(url, headers=alice, timeout=30).status_code == 200, url
        assert requests.get(url, headers=tina, timeout=30).status_code == 403, url
    refused = requests.post(
        f"{api}/dags/{VISION_INGEST}/dagRuns", headers=tina, json={"logical_date": None}, timeout=30
    )
    assert refused.status_code == 403, refused.text
    assert trainyard(airflow, "data", "log", "--repo", "vision-pets", token=airflow.token("alice")).returncode == 0
    for command in (["log"], ["ls"], ["tag", "mine"], ["upload", str(folder), "--team", "default"]):
        said = trainyard(airflow, "data", *command, "--repo", "vision-pets", token=airflow.token("tina"))
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
                timeout=30,
            )
            # marked failed, its task is killed at its next heartbeat, and its processes with it
            airflow.wait(
                lambda: not _processes_of(str(airflow.trainyard_home / "runs" / "trains-on")),
                120,
                "alice's job to stop",
            )
