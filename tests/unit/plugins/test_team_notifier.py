"""TeamNotifier against a real HTTP server on this machine: what each event posts, to whom, and that a
target that cannot be reached costs the others nothing. The context is the task's, reduced to what the
notifier reads; the webhook is real (an Airflow http connection, the http provider's HttpNotifier)."""

import json

import pytest

from trainyard_airflow.notifications import TeamNotifier
from webhook import webhook_receiver

GATE = {
    "passed": False,
    "checks": [{"metric": "val_accuracy", "value": 0.41, "min": 0.9, "max": None, "passed": False, "margin": -0.49}],
}


@pytest.fixture
def webhook():
    with webhook_receiver() as (port, received):
        yield port, received


@pytest.fixture
def team(tmp_path, monkeypatch, webhook):
    """Team vision told through a webhook, a second one that is down and a connection of a type trainyard
    does not send to; team nlp has no targets."""
    port, _ = webhook
    config = tmp_path / "config"
    config.mkdir()
    (config / "resources.yaml").write_text(
        "gpu_types: {a100: {count: 2, price_per_hour: 1.0}}\n"
        "teams:\n"
        "  vision: {monthly_budget: 0.0, notify: [vision_down, vision_ftp, vision_hook]}\n"
        "  nlp: {}\n"
    )
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    conn = {"conn_type": "http", "host": "127.0.0.1", "schema": "http"}
    monkeypatch.setenv("AIRFLOW_CONN_VISION_HOOK", json.dumps({**conn, "port": port}))
    monkeypatch.setenv("AIRFLOW_CONN_VISION_DOWN", json.dumps({**conn, "port": 9}))  # nothing listens
    monkeypatch.setenv("AIRFLOW_CONN_VISION_FTP", json.dumps({"conn_type": "ftp", "host": "127.0.0.1"}))


class _TI:
    def __init__(self, task_id: str, xcoms: dict):
        self.task_id, self.xcoms, self.log_url = task_id, xcoms, f"http://airflow/log/{task_id}"

    def xcom_pull(self, task_ids: str, key: str = "return_value"):
        return self.xcoms.get((task_ids, key))


class _Run:
    dag_id, run_id, triggering_user_name = "train_pipeline", "manual__1", "tina"

    def __init__(self, conf: dict):
        self.conf = conf


def _context(task_id: str, xcoms: dict, conf: dict | None = None, error: str = "") -> dict:
    return {"ti": _TI(task_id, xcoms), "dag_run": _Run(conf or {}), "exception": error, "params": {}}


SPEC = {("validate_spec", "return_value"): {"name": "digits", "resources": {"team": "vision"}}}


def test_a_failed_gate_posts_one_notice_with_its_table_and_a_dead_target_costs_the_others_nothing(team, webhook):
    _, received = webhook
    context = _context("gate", {**SPEC, ("gate", "gate_result"): GATE}, error="gate failed")
    TeamNotifier(event="failure").notify(context)
    assert len(received) == 1
    (notice,) = received
    assert (notice["kind"], notice["team"], notice["job"]) == ("gate_failed", "vision", "digits")
    assert notice["gate"] == GATE and "val_accuracy" in notice["text"] and "FAILED by 0.49" in notice["text"]
    assert notice["url"] == "http://airflow/log/gate"


def test_a_failure_before_the_spec_was_valid_goes_to_the_log_only_and_a_promotion_s_to_the_model_s_team(
    team, webhook, monkeypatch
):
    """A conf may name any team: until the spec is validated, no team's targets hear what it wrote. A failed
    promotion goes to the team of the model (its versions' ``team`` tag)."""
    from trainyard import paths
    from trainyard.tracking import mlflow_tracking as mt

    _, received = webhook
    context = _context("validate_spec", {}, conf={"name": "x", "resources": {"team": "vision"}}, error="bad\nmore")
    TeamNotifier(event="failure").notify(context)
    assert received == []

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    c = mt.client()
    run = c.create_run(mt.experiment_id(c, "digits", "default")).info.run_id
    c.create_registered_model("digits")
    c.create_model_version("digits", source=f"runs:/{run}/model", run_id=run, tags={"team": "vision"})
    promotion = {**_context("verify", {}, error="signature does not verify\n..."), "params": {"model": "digits"}}
    TeamNotifier(event="failure").notify(promotion)
    assert [(n["kind"], n["team"], n["job"], n["error"]) for n in received] == [
        ("run_failed", "vision", "digits", "signature does not verify")
    ]
    TeamNotifier(event="failure").notify({**promotion, "params": {"model": "unknown"}})
    assert len(received) == 1  # a model nobody registered: the log only


def test_a_registered_version_and_the_budget_are_told_once(team, webhook):
    _, received = webhook
    info = {"name": "digits", "version": "3"}
    TeamNotifier(event="registered").notify(_context("register", {**SPEC, ("register", "return_value"): info}))
    assert [(n["kind"], n["model"], n["version"], n["alias"], n["by"]) for n in received] == [
        ("new_version", "digits", "3", "staging", "tina")
    ]
    # a budget of 0 is spent at once: told at the first training's end of the month, not at the next
    TeamNotifier(event="training_ended").notify(_context("train", SPEC))
    TeamNotifier(event="training_ended").notify(_context("train", SPEC))
    assert [n["kind"] for n in received] == ["new_version", "budget_warning"]
    assert received[1]["team"] == "vision" and received[1]["budget"] == 0.0


def test_a_dag_that_knows_its_team_names_it(team, webhook):
    """A retraining job's DAG tells the team of its job file when it cannot start."""
    _, received = webhook
    context = _context("pin_commit", {}, error="an asset event names commit 'dev'")
    TeamNotifier(event="failure", team="vision").notify(context)
    assert [(n["kind"], n["team"], n["task"]) for n in received] == [("run_failed", "vision", "pin_commit")]
