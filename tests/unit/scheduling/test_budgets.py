"""Cost and budgets: a team's spend per month from every try's usage record, commitments of the jobs it
has running, the worst case a job must fit in, `trainyard report cost`, and max_hours as the workers'
time limit."""

import calendar
import json
import time

import pytest

from trainyard.scheduling import budgets
from trainyard.scheduling.admission.ledger import Ledger
from trainyard.scheduling.admission.policy import Job
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


def test_a_new_try_is_counted_at_the_next_look_and_what_was_spent_stays_spent(tmp_path):
    """The journal is filled once from the runs made before it, then every try is appended as it is
    recorded; a look reads what came since the last. A run directory deleted later does not refund."""
    cfg = parse_resources(FLEET)
    now = DEC
    run = _run(tmp_path, "r1", "vision", [(now - 7200, 1.0, 1)])  # before the journal existed
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(2.0)  # from the usage files
    assert not (tmp_path / usage.SPEND_DIR).exists()  # only an admission look fills the journal
    budgets.fill_journal(cfg, tmp_path)
    assert (tmp_path / usage.SPEND_DIR / "2026-12.jsonl").is_file()
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(2.0)
    usage.record_try(run, attempt=2, started=now - 3600, ended=now, gpus=1, where="local")  # the retry ends
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(4.0)
    import shutil

    shutil.rmtree(run)
    assert budgets.spent_this_month(cfg, tmp_path, now)["vision"] == pytest.approx(4.0)


def test_a_look_reads_this_month_s_journal_not_every_run(tmp_path, monkeypatch):
    """Once the journal is there, the budget gate opens no run directory but those of the jobs it is
    asked about: its cost is the queue's, not the run history's."""
    cfg = parse_resources(FLEET)
    for i in range(30):
        _run(tmp_path, f"old{i}", "nlp", [(NOV, 1.0, 1)])
    _run(tmp_path, "mine", "vision", [(DEC, 1.0, 2)])
    budgets.fill_journal(cfg, tmp_path)
    opened: list[str] = []
    real = budgets.read_usage
    monkeypatch.setattr(budgets, "read_usage", lambda path: opened.append(str(path)) or real(path))
    monkeypatch.setattr(budgets, "_parsed", {})
    budgets.fill_journal(cfg, tmp_path)
    spend = budgets.current_spend(cfg, tmp_path, DEC)
    assert spend.this_month["vision"] == pytest.approx(4.0) and spend.this_month["nlp"] == 0
    assert spend.of_run("mine") == pytest.approx(4.0)
    assert opened == [str(tmp_path / "digits" / "mine" / usage.USAGE_FILE)]


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


def test_a_sweep_must_afford_its_parallel_trials(tmp_path):
    cfg = parse_resources(FLEET)
    _run(tmp_path, "r1", "vision", [(DEC, 10.0, 4)])  # 80 spent, 20 left
    standing = budgets.team_months(cfg, "2026-12", tmp_path)["vision"]
    resources = {"team": "vision", "gpu_type": "a100", "gpus_per_node": 1, "max_hours": 5}  # 10 a trial
    sweep = {
        "name": "lr",
        "parameters": [{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.01, "high": 0.1}],
    }
    budgets.check_budget(parse_spec({"resources": resources, "sweep": {**sweep, "parallelism": 2}}), cfg, standing)
    with pytest.raises(SpecError) as err:
        budgets.check_budget(parse_spec({"resources": resources, "sweep": {**sweep, "parallelism": 3}}), cfg, standing)
    text = str(err.value)
    assert "the worst case of 3 trials at once (sweep.parallelism), 2/slot-hour x 5 h x 1 slot(s) x 3 = 30.00" in text
    assert "or a lower sweep.parallelism" in text
    two_trials = parse_spec({"resources": resources, "sweep": {**sweep, "parallelism": 3, "trials": 2}})
    budgets.check_budget(two_trials, cfg, standing)  # no more than its trials at once


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


def _look(cfg, runs_root) -> None:
    """What an admission look does with the spend: fill the journal (once), read this month's."""
    budgets.fill_journal(cfg, runs_root)
    budgets.spent_this_month(cfg, runs_root, DEC)


def _record_tries(run_dir: str, count: int) -> None:
    for i in range(count):
        usage.record_try(run_dir, attempt=i + 1, started=DEC, ended=DEC + 36, gpus=1, where="local")


def test_concurrent_tries_and_the_first_look_count_every_try_once(tmp_path):
    """Real processes record tries of their runs while others look for the first time (and so fill the
    journal from the usage files): each try is in the month's spend exactly once."""
    import multiprocessing

    cfg = parse_resources(FLEET)
    runs = [_run(tmp_path, f"r{i}", "vision", [(DEC, 0.01, 1)]) for i in range(4)]  # 36 GPU-s each, before
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_record_tries, args=(str(run), 25)) for run in runs]
    lookers = [ctx.Process(target=_look, args=(cfg, tmp_path)) for _ in range(3)]
    for p in writers + lookers:
        p.start()
    for p in writers + lookers:
        p.join(120)
        assert p.exitcode == 0
    tries = 4 * (1 + 25)
    assert budgets.spent_this_month(cfg, tmp_path, DEC)["vision"] == pytest.approx(2.0 * tries * 36 / 3600)
    assert budgets.team_months(cfg, "2026-12", tmp_path)["vision"].tries == tries


# -- Kubernetes trainings' reservations ---------------------------------------------------------------------
def _k8s_spec(hours: float, gpus: int = 2) -> object:
    return parse_spec({"resources": {"team": "vision", "gpu_type": "a100", "gpus_per_node": gpus, "max_hours": hours}})


def test_a_kubernetes_training_reserves_its_worst_case_until_released(tmp_path):
    cfg = parse_resources(FLEET)
    made = budgets.reserve(cfg, tmp_path, _k8s_spec(10.0), "train_pipeline/k1", wait_s=600)  # 2 x 10 h x 2 = 40
    assert budgets.reserved(cfg, tmp_path) == {"vision": pytest.approx(40.0)}
    standing = budgets.team_months(cfg, budgets.month_of(time.time()), tmp_path)["vision"]
    assert (standing.committed, standing.left) == (pytest.approx(40.0), pytest.approx(60.0))
    assert budgets.current_spend(cfg, tmp_path).reserved == {"vision": pytest.approx(40.0)}  # the ledger's gate
    again = budgets.reserve(cfg, tmp_path, _k8s_spec(10.0), "train_pipeline/k1", wait_s=600)
    assert again.until >= made.until  # a retry keeps its reservation, counted once, lapsing from its start
    assert budgets.reserved(cfg, tmp_path) == {"vision": pytest.approx(40.0)}
    with pytest.raises(SpecError) as err:  # 2 x 16 h x 2 = 64 > 60
        budgets.reserve(cfg, tmp_path, _k8s_spec(16.0), "train_pipeline/k2", wait_s=600)
    assert "team 'vision' has left in" in str(err.value) and "60.00 of 100.00" in str(err.value)
    assert set(budgets.reservations(tmp_path)) == {"train_pipeline/k1"}  # a refusal reserves nothing
    budgets.release(tmp_path, "train_pipeline/k1")
    assert budgets.reserved(cfg, tmp_path) == {}
    budgets.reserve(cfg, tmp_path, _k8s_spec(16.0), "train_pipeline/k2", wait_s=600)


def test_a_reservation_lapses_after_its_pods_wait_and_max_hours(tmp_path):
    cfg = parse_resources(FLEET)
    made = budgets.reserve(cfg, tmp_path, _k8s_spec(1.0), "train_pipeline/k1", wait_s=600)
    assert made.until == pytest.approx(made.made + 600 + 3600)
    assert budgets.reserved(cfg, tmp_path, now=made.until - 1) == {"vision": pytest.approx(4.0)}
    assert budgets.reserved(cfg, tmp_path, now=made.until + 1) == {}  # a worker that died never released it


def _reserve_one(cfg, root: str, key: str, hours: float, start) -> None:
    from pathlib import Path

    start.wait(60)  # all at once, once every process has imported
    try:
        budgets.reserve(cfg, Path(root), _k8s_spec(hours), key, wait_s=60)
    except SpecError:
        raise SystemExit(3) from None


def test_of_many_trainings_reserving_at_once_only_those_that_fit_start(tmp_path):
    """Real processes reserve at once for six trainings of 40 each in a budget of 100: exactly two get
    one, whatever the order; the others are refused naming the budget."""
    import multiprocessing

    cfg = parse_resources(FLEET)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(7)
    keys = [f"train_pipeline/k{i}" for i in range(6)]
    procs = [ctx.Process(target=_reserve_one, args=(cfg, str(tmp_path), key, 10.0, start)) for key in keys]
    for p in procs:
        p.start()
    start.wait(60)
    for p in procs:
        p.join(120)
    assert sorted(p.exitcode for p in procs) == [0, 0, 3, 3, 3, 3]
    assert len(budgets.reservations(tmp_path)) == 2
    assert budgets.reserved(cfg, tmp_path) == {"vision": pytest.approx(80.0)}


def test_a_damaged_reservations_file_refuses_reservations_and_is_weighed_as_none(tmp_path, caplog):
    cfg = parse_resources(FLEET)
    (tmp_path / budgets.RESERVATIONS_FILE).write_text("{not json")
    assert budgets.reserved(cfg, tmp_path) == {}  # every look goes on
    assert "is not a reservations file" in caplog.text
    with pytest.raises(budgets.BadReservations, match="move it away to reset it"):
        budgets.reserve(cfg, tmp_path, _k8s_spec(1.0), "train_pipeline/k1", wait_s=60)
