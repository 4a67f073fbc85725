"""The Jobs page's rows (trainyard.jobs_view) on a real ledger, real run records and a real MLflow store:
a team sees its own runs only, each with its place and reason while it waits, its progress while it
trains, what it cost so far, its result and its links; the page's HTML escapes what users chose."""

from __future__ import annotations

import json
import math
import time

import pytest

from fleets import local_fleet
from trainyard.acting import Acting
from trainyard.jobs_view import AirflowRun, Tracked, job_rows, tracked_runs
from trainyard_airflow.pages import render_jobs

DAG = "train_pipeline"


def _spec(name: str, team: str, gpus: int = 2, epochs: int = 10) -> dict:
    from trainyard.spec import JobSpec

    return JobSpec.model_validate(
        {
            "name": name,
            "hyperparameters": {"epochs": epochs},
            "resources": {"team": team, "gpu_type": "a100", "gpus_per_node": gpus},
        }
    ).model_dump(mode="json")


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    from trainyard.scheduling.admission.policy import Job

    monkeypatch.setenv("TRAINYARD_MLFLOW_URL", "http://mlflow.example")
    monkeypatch.delenv("TRAINYARD_TENSORBOARD_URL", raising=False)
    ledger = local_fleet(
        tmp_path,
        monkeypatch,
        "gpu_types:\n  a100: {count: 4, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 2}}\n  nlp: {quota: {a100: 2}}\n",
    )
    assert ledger.request(Job(f"{DAG}/training", "vision", "a100", 2, 1, 1.0, "tina")).admitted
    assert ledger.request(Job(f"{DAG}/nlp-holds", "nlp", "a100", 2, 1, 1.0, "nina")).admitted
    assert not ledger.request(Job(f"{DAG}/waiting", "vision", "a100", 2, 1, 1.0, "tina")).admitted
    return ledger


def test_a_team_sees_its_runs_waiting_training_and_done_with_place_progress_cost_and_links(fleet):
    from trainyard import paths
    from trainyard.spec import safe_key
    from trainyard.training.run_config import RUN_CONFIG_FILE
    from trainyard.training.usage import record_try

    now = time.time()
    training = _spec("shapes", "vision")
    run_dir = paths.runs_root() / "shapes" / safe_key(f"{DAG}/training")
    run_dir.mkdir(parents=True)
    (run_dir / RUN_CONFIG_FILE).write_text(json.dumps({"spec": training}))
    record_try(run_dir, attempt=1, started=now - 7200, ended=now - 3600, gpus=2, where="local")  # a failed try: $4
    runs = [
        AirflowRun(DAG, "waiting", "running", tasks={"admit": "deferred"}, spec=_spec("digits", "vision")),
        AirflowRun(
            DAG,
            "training",
            "running",
            tasks={"admit": "success", "train": "running"},
            training_started=now - 1800,
            spec=training,
        ),  # fmt: skip
        AirflowRun(DAG, "nlp-holds", "running", tasks={"train": "running"}, spec=_spec("bleu", "nlp")),
        AirflowRun(
            DAG,
            "done",
            "success",
            tasks={"register": "success"},
            spec=_spec("digits", "vision"),
            registered={"name": "digits", "version": 3},
        ),  # fmt: skip
        AirflowRun(
            DAG,
            "refused",
            "failed",
            conf={"name": "typo", "resources.team": "vision", "hyperparameters": {"epochs": 0}},
            tasks={"validate_spec": "failed"},
            triggered_by="tina",
        ),
    ]
    tracked = {
        f"{DAG}/training": Tracked("r1", "7", {"epoch": 4, "samples_per_second": 812.25, "eta_seconds": 95.4}),
        f"{DAG}/done": Tracked("r2", "7", {"epoch": 10}),
    }
    rows = {
        r["run"].partition("/")[2]: r
        for r in job_rows(runs, Acting("tina", ("vision",)), fleet.config, fleet, tracked, now)
    }
    assert set(rows) == {"waiting", "training", "done", "refused"}  # nlp's run is nlp's
    waiting = rows["waiting"]
    assert (waiting["stage"], waiting["place"], waiting["gpu_type"], waiting["gpus"]) == (
        "waiting for GPUs",
        "1 of 1",
        "a100",
        2,
    )
    assert waiting["reason"] == "a100: 4 of 4 slots in use, the job needs 2" and waiting["progress"] is None
    # the first of the two holders ends by its max_hours (an hour) at the latest: the job starts by then
    first_end = min(e.admitted for e in fleet.entries() if e.admitted is not None) + 3600
    assert waiting["starts_by"] == pytest.approx(first_end, abs=1) and waiting["start"].startswith("starts by ")
    train = rows["training"]
    assert train["stage"] == "training" and train["place"] is None and train["reason"] is None
    assert train["progress"] == {"epoch": 4, "epochs": 10, "samples_per_second": 812.2, "eta_seconds": 95}
    assert train["cost"] == pytest.approx(4.0 + 2.0, abs=0.02)  # the recorded try, and half an hour on 2 GPUs now
    assert train["links"]["mlflow"] == "http://mlflow.example/#/experiments/7/runs/r1"
    assert (
        train["links"]["curves"].endswith("/runs/r1/model-metrics")
        and train["links"]["run"] == "/dags/train_pipeline/runs/training"
    )
    done = rows["done"]
    assert (
        done["result"] == "model digits version 3"
        and done["links"]["model"] == "http://mlflow.example/#/models/digits/versions/3"
    )
    assert (rows["refused"]["job"], rows["refused"]["result"]) == ("typo", "its spec was refused")
    # a run whose spec no task validated is its triggering user's (and admins'), whatever team its conf
    # claims; a team's own DAG's run is that team's, whatever its conf says
    runs += [
        AirflowRun(DAG, "claims-vision", "failed", conf={"resources": {"team": "vision"}}, triggered_by="nina"),
        AirflowRun(f"{DAG}.nlp", "claims-too", "running", conf={"resources": {"team": "vision"}}, triggered_by="nina"),
    ]
    seen = {r["run"] for r in job_rows(runs, Acting("tina", ("vision",)), fleet.config, fleet, tracked, now)}
    assert f"{DAG}/claims-vision" not in seen and f"{DAG}.nlp/claims-too" not in seen and f"{DAG}/refused" in seen
    nina = {r["run"]: r for r in job_rows(runs, Acting("nina", ("nlp",)), fleet.config, fleet, tracked, now)}
    assert f"{DAG}/claims-vision" in nina and nina[f"{DAG}.nlp/claims-too"]["team"] == "nlp"
    # an admin reads every run; nobody logged in, none
    assert len(job_rows(runs, Acting("root", (), admin=True), fleet.config, fleet, tracked, now)) == 7
    assert [r["run"] for r in job_rows(runs, Acting(None, ()), fleet.config, fleet, tracked, now)] == []


def test_progress_skips_what_is_not_a_number_of_progress(fleet):
    """A program's metrics file may log NaN or infinity: the page still shows, with what is known."""
    run = AirflowRun(DAG, "training", "running", tasks={"train": "running"}, spec=_spec("shapes", "vision"))
    odd = {
        f"{DAG}/training": Tracked("r1", "7", {"epoch": 2.0, "samples_per_second": math.inf, "eta_seconds": math.nan})
    }
    (row,) = job_rows([run], Acting("tina", ("vision",)), fleet.config, fleet, odd)
    assert row["progress"] == {"epoch": 2, "epochs": 10, "samples_per_second": None, "eta_seconds": None}
    assert json.dumps(row)  # the page's JSON


def test_the_jobs_page_escapes_what_users_chose_and_links_only_web_addresses():
    row = {
        "run": "train_pipeline/<b>x</b>", "job": "<script>alert(1)</script>", "stage": "training", "state": "running",
        "links": {"run": "/dags/train_pipeline/runs/x", "mlflow": "javascript:alert(1)"},
        "progress": {"epoch": 1, "epochs": 3, "samples_per_second": 10.0, "eta_seconds": 7}, "cost": 1234.5,
    }  # fmt: skip
    page = render_jobs([row])
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "javascript:" not in page and 'href="/dags/train_pipeline/runs/x"' in page
    assert "epoch 1/3, 10 samples/s, ETA 7 s" in page and "$1,234.50" in page


def test_tracked_runs_finds_each_runs_mlflow_run_by_its_run_key(tmp_path):
    from mlflow import MlflowClient

    from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    digits = c.create_experiment("digits")
    for key, epoch in ((f"{DAG}/a", 2), (f"{DAG}/b", 5)):
        run = c.create_run(digits, tags={RUN_KEY_TAG: key})
        c.log_metric(run.info.run_id, "epoch", epoch)
    found = tracked_runs(c, {"digits": [f"{DAG}/a", f"{DAG}/b"], "never-ran": [f"{DAG}/c"]})
    assert {k: t.metrics["epoch"] for k, t in found.items()} == {f"{DAG}/a": 2, f"{DAG}/b": 5}
    assert found[f"{DAG}/a"].experiment_id == digits
