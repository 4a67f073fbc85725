"""The Airflow REST API for real, and the queue behind it: api-server, scheduler, dag-processor and team
default's triggerer as processes, LocalExecutor.

Trigger train_pipeline with a conf and wait for success; trigger it with a field its Param refuses (400)
and with sections only the JobSpec checks and see the first task fail naming the fields; no token -> 401; a
viewer cannot trigger (403); a user may trigger but not run the job of a team they are not in. Then the
queue: a run that fails before training never queues, and a job waiting in the triggerer behind one that
fails on its last try starts within one look, through an edit that broke resources.yaml meanwhile;
`trainyard queue` says why a job waits, and its user cancels it.
"""

import json
import re
import shutil
import sys
from datetime import datetime
from pathlib import Path

import browser
import pytest
import requests
from dag_helpers import airflow_with_its_config, require_the_sandbox, trainyard_cli, wait_for_dags

import checkout

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
DAG = "train_pipeline.default"  # team default's own (multi-team mode)
VISION_DAG = "train_pipeline.vision"  # another team's, which bob may not trigger
airflow_services = checkout.airflow_services()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    if not shutil.which("airflow", path=str(Path(sys.executable).parent)):
        pytest.fail("airflow is not installed in this environment: run the suite with `make test`")
    af = airflow_with_its_config(tmp_path_factory, airflow_services)
    # Airflow-level users for these tests: admin, a viewer, bob, who may trigger (op) and is in team nlp, and
    # tina, who may trigger runs and nothing more, in team default only (resources.yaml)
    af.setup(users="admin:admin,ann:viewer,bob:op,tina:user")
    af.start(teams=("default",))  # every run here is team default's (vision's is refused before it runs)
    headers = af.headers("admin")  # so any test may trigger at once, whichever runs first
    wait_for_dags(af, headers, DAG, VISION_DAG)  # both teams': one test asks for a 403 of vision's
    yield af
    af.stop()


def _wait_run(af, headers, run_id, seconds=900):
    return af.wait_run(DAG, run_id, headers, seconds)


def _task_instances(af, headers, run_id):
    return af.task_instances(DAG, run_id, headers)


def _post_run(af, headers, conf=None, dag_id=DAG) -> requests.Response:
    """Airflow's answer to a trigger of ``dag_id`` with ``conf`` (none: the DAG's defaults)."""
    body = {"logical_date": None} if conf is None else {"logical_date": None, "conf": conf}
    return requests.post(
        f"{af.url}/api/v2/dags/{dag_id}/dagRuns", headers=headers, json=body, timeout=airflow_services.PATIENT_SECONDS
    )


def test_auth_is_required(airflow):
    assert requests.get(f"{airflow.url}/api/v2/dags", timeout=airflow_services.PATIENT_SECONDS).status_code == 401
    r = _post_run(airflow, {})
    assert r.status_code == 401


def test_trigger_with_conf_runs_to_success(airflow, tmp_path):
    """A run triggered with a conf succeeds, and none of its tasks logs an ERROR line; it is
    bench/orchestration.py's scheduled side, so the benchmark is run here, at its smallest (one run a
    side), against this Airflow rather than a second one."""
    headers = {"Authorization": f"Bearer {airflow.token('admin')}"}
    airflow.wait(
        lambda: (
            requests.get(
                f"{airflow.url}/api/v2/dags/{DAG}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
            ).ok
        ),
        600,
        "the DAG to be parsed",
    )
    conf = {  # sections as objects (a REST client's way) and fields by path (the trigger form's), mixed
        "hyperparameters": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1, "seed": 1},
        "resources.gpus_per_node": 1,
        "resources.gpu_type": "cpu",
        "resources.priority": 7,
        "gates": [{"metric": "val_accuracy", "min": 0.8}],
    }
    lines, (run_id,) = checkout.orchestration_bench().measure(airflow, conf, 1, tmp_path / "plain")
    report = "\n".join(lines)
    wall = r"pipeline wall: first run +in process +[\d.]+ s +under Airflow +[\d.]+ s +ratio [\d.]+x"
    assert re.search(wall, report), report
    assert re.search(r"gap between tasks: median [\d.]+ s, p95 [\d.]+ s \(13 tasks\)", report), report
    assert re.search(r"\n  register +[\d.]+ s +[\d.]+ s", report), report
    tis = _task_instances(airflow, headers, run_id)  # the run succeeded: measure says why when it did not
    # no red line in a task that succeeded (MLflow's stderr handler and progress bars, the exporter's notes)
    red = {task: lines for task, lines in airflow.error_lines(DAG, run_id, headers).items() if lines}
    assert not red, red
    # The conf's resources reached the scheduler: pool, pool_slots and priority of the train task.
    train = tis["train"]
    assert (train["pool"], train["pool_slots"], train["priority_weight"]) == ("gpu-cpu", 1, 1007)
    # triggered without a note, the run got one as the scheduler started it: which job it is
    run = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
    ).json()
    assert run["note"] == "digits: digits_cnn on 1 x cpu, team default", run
    r = requests.get(
        f"{airflow.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/register/xcomEntries/return_value",
        headers=headers,
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert r.ok, r.text
    assert "version" in json.dumps(r.json()["value"])


def test_invalid_conf_fails_at_the_first_task(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('admin')}"}
    # a field the trigger form's way (by its path) is refused by its Param before a run exists, by name
    r = _post_run(airflow, headers, {"hyperparameters.epochs": -5})
    assert r.status_code == 400 and "param hyperparameters.epochs: -5 is less than the minimum of 1" in r.text, r.text
    # sections as objects, and rules across fields, are the first task's (the JobSpec's): the run fails there,
    # naming the fields
    r = _post_run(
        airflow, headers, {"split": {"val_fraction": 0.6, "test_fraction": 0.5}, "hyperparameters": {"epochs": -5}}
    )
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
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert log.ok, log.text
    assert "invalid JobSpec" in log.text and "val_fraction + test_fraction must be < 1" in log.text
    assert "hyperparameters.epochs: Input should be greater than or equal to 1 (got -5)" in log.text


def test_a_user_outside_a_team_cannot_run_its_job(airflow):
    """bob (teams default and nlp) may not trigger team vision's own DAG (Airflow answers 403), nor run a
    vision job in his team's DAG: its first task fails, naming the team's DAG, before anything runs."""
    headers = {"Authorization": f"Bearer {airflow.token('bob')}"}
    conf = {"resources": {"team": "vision", "gpus_per_node": 1}}
    r = _post_run(airflow, headers, conf, dag_id=VISION_DAG)
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
        timeout=airflow_services.PATIENT_SECONDS,
    )
    assert "resources.team: 'vision' is not the team of train_pipeline.default" in log.text, log.text[-3000:]


def test_viewer_cannot_trigger(airflow):
    headers = {"Authorization": f"Bearer {airflow.token('ann')}"}
    assert _post_run(airflow, headers).status_code == 403


def _ended(ti: dict) -> datetime:
    return datetime.fromisoformat(ti["end_date"])


def test_the_queue_keeps_moving_through_failures_and_a_broken_edit(airflow):
    """Both jobs want the fleet's two cpu slots. A run whose dataset ref does not resolve fails there and
    never asks for them. A custom command that fails on both of its tries holds them while it runs; the
    job behind it waits deferred in the triggerer, through a typo in resources.yaml (the last good file
    stays in force, the triggerer's log says what is wrong), and is admitted within one look of the final
    failure, not after the lease kept for a retry that will not come."""
    require_the_sandbox()
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


# A custom program that reports its progress as the platform reads it (its metrics file), then holds its GPUs.
REPORTS_PROGRESS_THEN_SLEEPS = """import json, os, time
with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"step": 40, "epoch": 3, "samples_per_second": 512.0, "eta_seconds": 95}) + "\\n")
time.sleep(3600)
"""


def test_trainyard_queue_shows_why_a_job_waits_and_its_user_cancels_it(airflow):
    """What users ask first when a job does not start: `trainyard queue` says who holds the slots and why
    the job waits, in the admit task's words, to the team's members (another team's user sees team, GPUs
    and priority); `trainyard queue cancel` ends the waiting run through Airflow's API (as the user the
    token names) and frees its place at once."""
    require_the_sandbox()
    headers = airflow.headers("tina")
    gpus = {"gpus_per_node": 2, "gpu_type": "cpu"}
    holder = airflow.trigger(
        DAG,
        {"name": "holder", "recipe": "custom", "resources": gpus, "hyperparameters": {"epochs": 10},
         "custom": {"command": [sys.executable, "-c", REPORTS_PROGRESS_THEN_SLEEPS]}},
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
        shown = trainyard_cli(airflow, "queue", "--json", token=airflow.token("tina"))
        assert shown.returncode == 0, shown.stderr
        jobs = {j["run"]: j for j in json.loads(shown.stdout)}
        # nobody logged in sees how much of the fleet a job asks for, not what or whose (another team's member
        # neither: the fork bomb test shows it)
        nobody = {"AIRFLOW_API_TOKEN": "", "XDG_CONFIG_HOME": str(airflow.trainyard_home / "no-login")}
        others = trainyard_cli(airflow, "queue", "--json", env=nobody)
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
        # with its place in the queue (the reason's "cpu: " said once)
        assert f"waiting, 1 of 1 for cpu: {second['reason'].removeprefix('cpu: ')}" in log

        # the Fleet page of the Airflow UI says the same, behind Airflow's login, as each user may see it
        fleet = f"{airflow.url}/trainyard/fleet"
        assert requests.get(f"{fleet}.json", timeout=airflow_services.PATIENT_SECONDS).status_code == 401
        view = requests.get(f"{fleet}.json", headers=headers, timeout=airflow_services.PATIENT_SECONDS).json()
        (cpu,) = [t for t in view["gpu_types"] if t["gpu_type"] == "cpu"]
        assert (cpu["slots"], cpu["in_use"], cpu["free"]) == (2, 2, 0), cpu
        assert [j["run"] for j in cpu["holders"]] == [f"{DAG}/{holder}"]
        assert [(j["run"], j["reason"]) for j in cpu["waiting"]] == [(f"{DAG}/{waiting}", second["reason"])]
        teams = {t["team"]: t for t in view["teams"]}
        assert "spent" in teams["default"] and "spent" not in teams["vision"]  # tina's team's money only
        page = requests.get(fleet, headers=headers, timeout=airflow_services.PATIENT_SECONDS)
        assert page.ok and "cpu: 2 of 2 slots in use, 0 free" in page.text and second["reason"] in page.text
        plugins = requests.get(
            f"{airflow.url}/api/v2/plugins", headers=headers, timeout=airflow_services.PATIENT_SECONDS
        ).json()["plugins"]
        views = {v["name"]: v["href"] for p in plugins for v in p["external_views"]}
        assert views == {"Jobs": "/trainyard/jobs", "Fleet": "/trainyard/fleet"}, views  # in the UI's navigation
        _the_jobs_and_fleet_pages_show_them(airflow, headers, holder, waiting, second["reason"])

        done = trainyard_cli(airflow, "queue", "cancel", waiting, token=airflow.token("tina"))
        assert done.returncode == 0, done.stderr
        assert airflow.wait_run(DAG, waiting, headers, 120)["state"] == "failed"
        left = {
            j["run"] for j in json.loads(trainyard_cli(airflow, "queue", "--json", token=airflow.token("tina")).stdout)
        }
        assert f"{DAG}/{waiting}" not in left and f"{DAG}/{holder}" in left
    finally:  # clean-up: the module's next test (if any) gets the slots back
        trainyard_cli(airflow, "queue", "cancel", holder, token=airflow.token("admin"))
        airflow.wait_run(DAG, holder, headers, 120)


def _the_jobs_and_fleet_pages_show_them(airflow, headers, holder, waiting, reason):
    """The Jobs page (its JSON, then in a browser, as tina logs in) lists the training job with its progress
    and links and the waiting one with its place and reason; the Fleet page shows who holds the slots."""
    jobs_url = f"{airflow.url}/trainyard/jobs.json"
    assert (
        requests.get(jobs_url, timeout=airflow_services.PATIENT_SECONDS).status_code == 401
    )  # Airflow's login, as every page

    def jobs():
        return {
            j["run"]: j
            for j in requests.get(jobs_url, headers=headers, timeout=airflow_services.PATIENT_SECONDS).json()
        }

    airflow.wait(lambda: (jobs()[f"{DAG}/{holder}"].get("progress") or {}).get("epoch") == 3, 120, "the progress")
    rows = jobs()
    training, queued = rows[f"{DAG}/{holder}"], rows[f"{DAG}/{waiting}"]
    assert training["progress"] == {"epoch": 3, "epochs": 10, "samples_per_second": 512.0, "eta_seconds": 95}
    assert (training["stage"], training["job"], training["recipe"], training["gpus"]) == (
        "training",
        "holder",
        "custom",
        2,
    )
    assert "/#/experiments/" in training["links"]["mlflow"] and "curves" in training["links"]
    assert (queued["stage"], queued["place"], queued["reason"]) == ("waiting for GPUs", "1 of 1", reason)
    assert "starts by " in queued["start"], queued  # the holder's max_hours bound it
    assert queued["note"] == "waiting: digits_cnn on 2 x cpu, team default"  # the note the scheduler gave it
    with browser.logged_in(airflow, "tina") as b:
        b.open("/plugin/jobs")  # the page as the UI's navigation shows it, in the UI's frame
        shown = b.wait_for(lambda: (t := b.text()) and "waiting for GPUs" in t and t, 60, "the Jobs page")
        assert "epoch 3/10, 512 samples/s, ETA 95 s" in shown and f"1 of 1: {reason}; {queued['start']}" in shown, shown
        b.screenshot("jobs-page")
        b.open("/plugin/fleet")
        shown = b.wait_for(lambda: (t := b.text()) and "slots in use" in t and t, 60, "the Fleet page")
        assert "cpu: 2 of 2 slots in use, 0 free" in shown and reason in shown and queued["start"] in shown, shown
        assert re.search(r"Utilisation, last 24 h: \d+%", shown) and re.search(r"cpu \d+%", shown), shown
        b.wait_for(  # the chart, drawn from Airflow's task records, loaded by the browser with the page's login
            lambda: b.driver.execute_script(
                "const f = document.querySelector('iframe'); const i = f && f.contentDocument.querySelector('img');"
                "return i && i.complete && i.naturalWidth > 0"
            ),
            60,
            "the utilisation chart",
        )
        b.screenshot("fleet-page")
    chart = requests.get(f"{airflow.url}/trainyard/fleet/utilisation.png", headers=headers, timeout=60)
    assert chart.ok and chart.headers["content-type"] == "image/png" and chart.content[:4] == b"\x89PNG"


def test_the_trigger_form_has_an_input_per_field_names_a_bad_value_and_submits_a_job(airflow):
    """In a browser, as a user fills it in: typed inputs in sections (a number box with its bounds, the GPU
    types with their prices), a value out of bounds refused by its field's name before a run exists, and a
    good one submitted as a run whose note says which job it is."""
    from selenium.webdriver.common.keys import Keys

    def button(b, title):  # clicked as a person does (a toast never covers these)
        return b.wait_for(lambda: [x for x in b.all("button") if x.text.strip() == title], 60, f"button {title}")[0]

    def typed(b, field, value):
        box = b.find(f"input[name='element_{field}']", usable=True)
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(value)
        return box

    admin = airflow.headers("admin")
    one_run = f"{airflow.url}/api/v2/dags/{DAG}/dagRuns"

    def from_the_form():
        runs = requests.get(
            f"{one_run}?order_by=-run_after&limit=5", headers=admin, timeout=airflow_services.PATIENT_SECONDS
        ).json()["dag_runs"]
        return [r for r in runs if r["conf"].get("name") == "from-the-form"]

    with browser.logged_in(airflow, "tina") as b:
        b.open(f"/dags/{DAG}")
        button(b, "Trigger").click()
        typed(b, "name", "from-the-form")
        shown = b.text()
        assert "cpu: $0.00 per GPU-hour, 2 in the fleet" in shown and "worst-case cost" in shown, shown
        b.screenshot("trigger-form")
        button(b, "Training").click()  # the form's sections open one at a time
        epochs = b.find("input[name='element_hyperparameters.epochs']")
        assert (epochs.get_attribute("aria-valuemin"), epochs.get_attribute("aria-valuemax")) == ("1", "1000")
        typed(b, "hyperparameters.epochs", "2")
        button(b, "Data").click()
        typed(b, "split.val_fraction", "0")
        submit = b.find("[data-testid=trigger-dag-submit]")
        b.click(submit)
        refusal = b.wait_for(lambda: b.find("[data-testid=error-alert]", 5).text, 30, "the refusal")
        assert "Invalid input for param split.val_fraction: 0 is less than or equal to the minimum of 0" in refusal
        assert not from_the_form()  # refused before a run exists
        b.screenshot("trigger-form-refused")
        typed(b, "split.val_fraction", "0.25")
        b.click(submit)
        (run,) = b.wait_for(from_the_form, 30, "the run the form triggered")
    assert run["conf"]["hyperparameters.epochs"] == 2 and run["conf"]["split.val_fraction"] == 0.25
    this_run = f"{one_run}/{run['dag_run_id']}"
    try:
        airflow.wait(
            lambda: requests.get(this_run, headers=admin, timeout=airflow_services.PATIENT_SECONDS).json()["note"],
            60,
            "the run's note",
        )
        note = requests.get(this_run, headers=admin, timeout=airflow_services.PATIENT_SECONDS).json()["note"]
        assert note == "from-the-form: digits_cnn on 2 x cpu, team default", note
    finally:  # nothing of it needs to train
        requests.patch(this_run, headers=admin, json={"state": "failed"}, timeout=airflow_services.PATIENT_SECONDS)
