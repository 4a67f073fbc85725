"""Cost and budgets: a team's spend per month from every try's usage record, commitments of the jobs it
has running, the worst case a job must fit in, `trainyard report cost`, and max_hours as the workers'
time limit."""

import calendar
import json
import time

import pytest

from trainyard.scheduling import budgets
from trainyard.scheduling.admission import Job, Ledger
from trainyard.scheduling.resources import parse_resources
from trainyard.spec import SpecError, parse_spec
from trainyard.training import usage
from trainyard.training.run_config import RUN_CONFIG_FILE

FLEET = """\
gpu_types:
  a100: {count: 8, price_per_hour: 2.0}
teams:
  vision: {quota: {a100: 4}, monthly_budget: 100}
  nlp: {quota: {a100: 4}}
"""
DEC = calendar.timegm((2026, 12, 10, 12, 0, 0))  # 2026-12-10 12:00 UTC
NOV = DEC - 30 * 86400


def _run(root, name, team, tries):
    run = root / "digits" / name
    run.mkdir(parents=True)
    (run / RUN_CONFIG_FILE).write_text(json.dumps({"spec": {"resources": {"team": team, "gpu_type": "a100"}}}))
    for attempt, (started, hours, gpus) in enumerate(tries, 1):
        usage.record_try(run, attempt=attempt, started=started, ended=started + hours * 3600, gpus=gpus, where="local")
    return run


def test_spend_per_team_and_month_counts_every_try(tmp_path):
    cfg = parse_resources(FLEET)
    _run(tmp_path, "r1", "vision", [(DEC, 1.0, 2), (DEC + 7200, 0.5, 2)])  # a failed try, then the retry
    _run(tmp_path, "r2", "vision", [(NOV, 3.0, 4)])  # last month
    _run(tmp_path, "r3", "nlp", [(DEC, 2.0, 1)])
    months = budgets.team_months(cfg, "2026-12", tmp_path)
    vision = months["vision"]
    assert (vision.runs, vision.tries, vision.gpu_hours) == (1, 2, pytest.approx(3.0))
    assert vision.spent == pytest.approx(2.0 * 3.0) and vision.left == pytest.approx(100 - 6.0)
    assert months["nlp"].spent == pytest.approx(4.0) and months["nlp"].left is None  # no budget: unlimited
    assert budgets.team_months(cfg, "2026-11", tmp_path)["vision"].spent == pytest.approx(24.0)


def test_a_new_try_is_counted_at_the_next_look_and_a_removed_run_is_forgotten(tmp_path):
    cfg = parse_resources(FLEET)
    now = DEC
    run = _run(tmp_path, "r1", "vision", [(now - 7200, 1.0, 1)])
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(2.0)
    usage.record_try(run, attempt=2, started=now - 3600, ended=now, gpus=1, where="local")  # the retry ends
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(4.0)
    (run / usage.USAGE_FILE).unlink()
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == 0
    assert not any(p.is_relative_to(tmp_path) for p in budgets._parsed)


def test_a_running_job_commits_its_worst_case_less_what_it_spent(tmp_path):
    cfg = parse_resources(FLEET)
    ledger = Ledger(tmp_path / "a.db", cfg)
    job = Job("train_pipeline/run-7", "vision", "a100", 2, 1, 10.0)
    assert ledger.request(job).admitted
    _run(tmp_path / "runs", "train_pipeline_run-7", "vision", [(time.time() - 3600, 1.0, 2)])  # its first try
    # (ends now: in this month whatever the hour)
    standing = budgets.team_months(cfg, budgets.month_of(time.time()), tmp_path / "runs", ledger)["vision"]
    assert standing.spent == pytest.approx(4.0)
    assert standing.committed == pytest.approx(2.0 * 10 * 2 - 4.0)
    assert standing.left == pytest.approx(100 - 40.0)


def test_a_job_whose_worst_case_does_not_fit_is_refused_with_the_numbers(tmp_path):
    cfg = parse_resources(FLEET)
    _run(tmp_path, "r1", "vision", [(DEC, 10.0, 4)])  # 80 spent
    standing = budgets.team_months(cfg, "2026-12", tmp_path)["vision"]
    fits = parse_spec({"resources": {"team": "vision", "gpu_type": "a100", "gpus_per_node": 2, "max_hours": 5}})
    budgets.check_budget(fits, cfg, standing)  # 2 x 5 h x 2 = 20 = what is left
    over = parse_spec({"resources": {"team": "vision", "gpu_type": "a100", "gpus_per_node": 2, "max_hours": 6}})
    with pytest.raises(SpecError) as err:
        budgets.check_budget(over, cfg, standing)
    text = str(err.value)
    assert "resources.max_hours: the job's worst case, 2/slot-hour x 6 h x 2 slot(s) = 24.00" in text
    assert "team 'vision' has left in 2026-12: 20.00 of 100.00 (80.00 spent" in text


def test_validate_spec_refuses_a_job_past_its_team_s_budget(trainyard_home):
    from trainyard.pipeline import validate_spec

    with pytest.raises(SpecError, match="more than team 'default' has left in"):
        validate_spec({"resources": {"gpu_type": "a100-80gb", "gpus_per_node": 2, "max_hours": 600}})


def test_report_cost_prints_each_team(trainyard_home, capsys):
    from trainyard.cli import main

    _run(trainyard_home / "runs", "r1", "default", [(time.time() - 3600, 1.0, 2)])  # ends now: this month
    assert main(["report", "cost"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("default "))
    assert line.split()[2:5] == ["1", "1", "2.000"]  # runs, tries, GPU-hours (the cpu type is free)
    with pytest.raises(SystemExit) as exit_:
        main(["report", "cost", "--month", "2026-13"])  # not a month: refused before anything is read
    assert exit_.value.code == 2
    assert "not a month; write it as YYYY-MM" in capsys.readouterr().err


def test_workers_are_stopped_at_max_hours(tmp_path):
    from trainyard.training.launchers.base import MaxHoursReached
    from trainyard.training.launchers.local import run

    marker = tmp_path / "still-running"
    t0 = time.monotonic()
    with pytest.raises(MaxHoursReached, match="stopped after"):
        # a worker in the background, as torchrun's are: the whole process group must stop, not the shell
        run(["bash", "-c", f"(sleep 2; touch {marker}) & wait"], on_line=lambda line: None, timeout_s=0.5)
    assert time.monotonic() - t0 < 15
    time.sleep(2.5)
    assert not marker.exists()


@pytest.mark.parametrize(
    "torn",
    ['{"attempt": 3, "started": 1', '{"attempt": 3}', '["started", 1]', '{"started": "x", "ended": 2, "gpus": 1}'],
    ids=["cut-short", "no-times", "not-an-object", "not-a-number"],
)
def test_a_malformed_usage_line_is_skipped_with_its_file_and_line_for_every_reader(tmp_path, caplog, torn):
    """A torn or hand-edited line costs nothing and names itself; the run's other tries still count, for
    the budget gate, the cost report and max_hours alike (one parser of usage records)."""
    cfg = parse_resources(FLEET)
    run = _run(tmp_path, "r1", "vision", [(DEC, 1.0, 2)])
    with (run / usage.USAGE_FILE).open("a") as f:
        f.write(torn + "\n")
    usage.record_try(run, attempt=4, started=DEC + 7200, ended=DEC + 9000, gpus=2, where="local")
    assert budgets.spent_this_month(cfg, tmp_path, DEC)["vision"] == pytest.approx(2.0 * (2 + 1))  # GPU-hours
    assert budgets.team_months(cfg, "2026-12", tmp_path)["vision"].tries == 2
    assert usage.wall_seconds(run) == pytest.approx(3600 + 1800)
    assert f"{run / usage.USAGE_FILE}:2: not a usage record" in caplog.text
