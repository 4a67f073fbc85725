"""Notices: the gate table, the once-a-month budget warning under concurrent processes, and the targets a
team's resources.yaml entry names."""

import multiprocessing
import threading
import time

import pytest

from trainyard import notifications
from trainyard.scheduling.resources import ResourcesError, parse_resources

GATE = {
    "passed": False,
    "checks": [
        {"metric": "val_accuracy", "value": 0.4123, "min": 0.9, "max": None, "passed": False, "margin": -0.4877},
        {"metric": "val_loss", "value": 0.5, "min": None, "max": 1.0, "passed": True, "margin": 0.5},
        {"metric": "val_top5", "value": None, "min": 0.5, "max": None, "passed": False, "margin": None},
        {
            "kind": "champion",
            "metric": "val_accuracy",
            "value": 0.4123,
            "min": 0.95,
            "passed": False,
            "margin": -0.5377,
            "champion": 0.95,
        },
    ],
}


def test_the_gate_table_has_a_row_per_check_with_its_verdict():
    table = notifications.gate_table(GATE).splitlines()
    assert table[0].split() == ["kind", "metric", "value", "min", "max", "verdict"]
    assert table[1].split() == ["threshold", "val_accuracy", "0.4123", "0.9", "-", "FAILED", "by", "0.4877"]
    assert table[2].split() == ["threshold", "val_loss", "0.5", "-", "1", "ok"]
    assert table[3].split() == ["threshold", "val_top5", "missing", "0.5", "-", "FAILED", "(not", "computed)"]
    assert table[4].split() == ["champion", "val_accuracy", "0.4123", "0.95", "-", "FAILED", "by", "0.5377"]
    notice = notifications.gate_failed("vision", "digits", "train_pipeline/r1", GATE, "http://x/log")
    assert notice.kind == "gate_failed" and notifications.gate_table(GATE) in notice.text
    assert notice.payload()["gate"] == GATE and notice.payload()["source"] == "trainyard"


def test_a_run_failure_names_the_task_and_the_first_line_of_its_error():
    notice = notifications.run_failed(None, "digits", "train_pipeline/r1", "train", "boom\ntraceback...", None)
    assert notice.subject == "[trainyard] digits: run failed at train"
    assert "boom" in notice.text and "traceback" not in notice.text


def _claim(args) -> bool:
    home, team, month = args
    from pathlib import Path

    return notifications.budget_warning_due(team, month, Path(home))


def test_the_budget_warning_is_due_once_per_team_and_month_among_concurrent_processes(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        claims = pool.map(_claim, [(str(tmp_path), "vision", "2026-12")] * 16)
    assert sum(claims) == 1
    assert notifications.budget_warning_due("vision", "2027-01", tmp_path)  # a new month
    assert notifications.budget_warning_due("nlp", "2026-12", tmp_path)  # another team


FLEET = """\
gpu_types:
  a100: {count: 2, price_per_hour: 1.0}
teams:
  vision:
    notify:
      - vision_webhook
      - {connection: vision_mail, kinds: [gate_failed, budget_warning]}
  nlp: {}
"""


def test_a_team_names_its_targets_each_for_all_or_some_kinds():
    fleet = parse_resources(FLEET, "resources.yaml")
    vision = fleet.teams["vision"].notify
    assert notifications.targets(vision, "gate_failed") == ["vision_webhook", "vision_mail"]
    assert notifications.targets(vision, "new_version") == ["vision_webhook"]
    assert notifications.targets(fleet.teams["nlp"].notify, "run_failed") == []  # the log only


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("{connection: hook, kinds: [lunch]}", "kinds"),
        ("{connection: 'bad id!'}", "connection"),
        ("{connection: hook, kinds: []}", "kinds"),
    ],
)
def test_a_bad_target_is_refused_naming_it(entry, problem):
    text = FLEET.replace("- vision_webhook", f"- {entry}")
    with pytest.raises(ResourcesError, match=rf"notify\.0\.{problem}"):
        parse_resources(text, "resources.yaml")


def _teller(error: Exception | None = None):
    """A notice to give: it records the seconds it is told and sets an event, then raises ``error`` if
    given. Returns ``(the seconds told, the event, the notice)``."""
    told: list[float] = []
    fired = threading.Event()

    def tell(seconds: float) -> None:
        told.append(seconds)
        fired.set()
        if error is not None:
            raise error

    return told, fired, tell


def test_a_training_past_its_expected_hours_is_told_once_and_a_quick_one_never(tmp_path):
    told, fired, tell = _teller()
    marker = tmp_path / "long_training" / "r1"
    with notifications.watch_training_time(0.1 / 3600, 0.0, marker, tell):
        assert fired.wait(30)  # the training runs on past 0.1 s
    assert len(told) == 1 and told[0] >= 0.1
    # a retry that starts past the time: its earlier tries count, and the run was told already
    with notifications.watch_training_time(0.1 / 3600, 3600.0, marker, tell):
        time.sleep(0.3)
    assert len(told) == 1
    with notifications.watch_training_time(1.0, 0.0, tmp_path / "quick", tell):
        pass
    with notifications.watch_training_time(None, 0.0, tmp_path / "none", tell):
        time.sleep(0.1)
    assert len(told) == 1 and not (tmp_path / "quick").exists()


def test_a_notice_that_fails_costs_the_training_nothing_and_a_retry_tells_instead(tmp_path):
    tries, attempted, broken = _teller(ConnectionError("webhook down"))
    marker = tmp_path / "m"
    with notifications.watch_training_time(0.05 / 3600, 0.0, marker, broken):
        assert attempted.wait(30)
    # the block's end waited for the notice; its exception was logged, not raised here, and not marked told
    assert len(tries) == 1 and not marker.exists()
    told: list[float] = []
    with notifications.watch_training_time(0.05 / 3600, 1.0, marker, told.append):
        pass
    assert len(told) == 1 and marker.exists()


def test_expected_hours_must_be_below_max_hours():
    from trainyard.spec import Resources, SpecError, parse_spec

    assert Resources(expected_hours=2, max_hours=4).expected_hours == 2
    with pytest.raises(SpecError, match=r"resources: .*expected_hours \(4\) must be below max_hours \(4\)"):
        parse_spec({"name": "digits", "resources": {"expected_hours": 4, "max_hours": 4}})
