"""The utilisation report's arithmetic: allocation clipped to the window, borrowing as usage above quota,
waits by size, violations of capacity and of quota + borrowing limit, and the chart."""

import pytest

from trainyard.scheduling.resources import parse_resources
from trainyard.scheduling.utilisation import Allocation, chart, format_report, percentile, report, timeline

FLEET = parse_resources("""\
gpu_types:
  a100: {count: 4, price_per_hour: 1.0}
  h100: {count: 2, price_per_hour: 2.0}
teams:
  vision: {quota: {a100: 2, h100: 1}, borrowing_limit: {a100: 1}}
  nlp: {quota: {a100: 2, h100: 1}}
""")


def alloc(run, team, gpu, slots, start, end, asked=None, first=True):
    return Allocation(run, team, gpu, slots, start, end, asked, first)


def test_utilisation_counts_slot_seconds_inside_the_window_only():
    records = [
        alloc("a", "vision", "a100", 2, 0, 100, asked=0),  # the whole window
        alloc("b", "nlp", "a100", 1, -50, 50, asked=-60),  # half of it inside
        alloc("c", "nlp", "h100", 1, 50, None, asked=40),  # still running at the end
    ]
    rep = report(FLEET, records, 0, 100)
    assert rep.pools["a100"].allocated_s == 2 * 100 + 1 * 50
    assert rep.pools["a100"].utilisation == pytest.approx(250 / 400)
    assert rep.pools["h100"].utilisation == pytest.approx(50 / 200)
    assert rep.fleet.utilisation == pytest.approx(300 / 600)
    assert rep.teams["vision"]["share"] == pytest.approx(200 / 300)
    assert rep.violations == []
    # only the types asked for make the fleet figure
    assert report(FLEET, records, 0, 100, ["h100"]).fleet.utilisation == pytest.approx(0.25)


def test_borrowed_is_what_a_team_holds_above_its_quota():
    records = [
        alloc("a", "vision", "a100", 2, 0, 100),
        alloc("b", "vision", "a100", 1, 20, 60),  # 1 above vision's quota of 2 for 40 s
    ]
    rep = report(FLEET, records, 0, 100)
    assert rep.teams["vision"]["borrowed_s"] == pytest.approx(40)
    assert rep.pools["a100"].borrowed_s == pytest.approx(40)
    assert rep.violations == []


def test_over_capacity_and_over_quota_plus_borrowing_are_violations():
    over_limit = [alloc("a", "vision", "a100", 2, 0, 20), alloc("b", "vision", "a100", 2, 5, 20)]
    (v,) = report(FLEET, over_limit, 0, 20).violations
    assert "team vision held 4 slots, its quota 2 + borrowing limit 1 (for 15.0 s at most; first at 5)" in v
    over_capacity = [alloc("a", "nlp", "h100", 2, 0, 10), alloc("b", "vision", "h100", 1, 0, 10)]
    found = report(FLEET, over_capacity, 0, 10).violations
    assert any("h100: 3 slots allocated at once, the type has 2 (for 10.0 s" in v for v in found), found
    # nlp has no borrowing limit: 2 of h100 is borrowing, not a violation of its own
    assert not any("team nlp" in v for v in found)


def test_a_slot_handed_over_is_not_a_violation():
    at_once = [alloc("a", "nlp", "h100", 2, 0, 10), alloc("b", "vision", "h100", 2, 10, 20)]
    assert report(FLEET, at_once, 0, 20).violations == []
    # the next job starts as the ledger frees the slots, a second before Airflow records the end of the last
    overlap = [alloc("a", "nlp", "h100", 2, 0, 10.8), alloc("b", "vision", "h100", 2, 10, 20)]
    assert report(FLEET, overlap, 0, 20).violations == []
    assert report(FLEET, overlap, 0, 20, tolerance=0.5).violations  # what the tolerance forgives


def test_waits_by_size_with_the_longest_and_the_jobs_still_waiting():
    records = [
        alloc("a", "vision", "a100", 1, 10, 20, asked=0),
        alloc("b", "vision", "a100", 1, 30, 40, asked=0),
        alloc("a-retry", "vision", "a100", 1, 50, 60, asked=None, first=False),  # a retry is not a new wait
        alloc("big", "nlp", "a100", 4, 60, 90, asked=5),
        alloc("queued", "nlp", "h100", 2, None, None, asked=70),
    ]
    rep = report(FLEET, records, 0, 100)
    assert rep.waits["1"].jobs == 2 and rep.waits["1"].p50_s == 10 and rep.waits["1"].max_s == 30
    assert rep.waits["3-4"].max_s == 55
    assert rep.waits["2"].jobs == 1 and rep.waits["2"].max_s == 30  # its wait so far
    assert rep.waiting == 1
    assert rep.longest_wait == ("big", 4, 55)
    text = format_report(rep)
    assert "longest wait: 55.0 s, big (4 slots)" in text and "violations: none" in text


def test_percentile_is_the_nearest_rank():
    assert percentile([], 95) == 0
    assert percentile([5.0], 50) == 5
    assert percentile([float(i) for i in range(1, 101)], 95) == 95
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2


def test_refuses_an_empty_window_and_an_unknown_type():
    with pytest.raises(ValueError, match="window is empty"):
        report(FLEET, [], 10, 10)
    with pytest.raises(ValueError, match=r"GPU types \['v100'\] are not in the resources file"):
        report(FLEET, [], 0, 10, ["v100"])


def test_timeline_and_chart(tmp_path):
    records = [alloc("a", "vision", "a100", 2, 0, 50), alloc("b", "nlp", "h100", 1, 25, 100)]
    times, held = timeline(records, 0, 100, points=5)
    assert times == [0, 25, 50, 75, 100]
    assert held == {"nlp": [0, 1, 1, 1, 0], "vision": [2, 2, 0, 0, 0]}
    png = chart(report(FLEET, records, 0, 100), records, tmp_path / "u.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_the_command_refuses_a_bad_window_before_reading_anything(capsys):
    from trainyard.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["report", "utilisation", "--since", "yesterday"])
    assert exited.value.code == 2
    assert "'yesterday' is not a date or time; write it as ISO 8601" in capsys.readouterr().err
    assert main(["report", "utilisation", "--since", "2026-12-02", "--until", "2026-12-01"]) != 0
    assert "the window is empty: --since must be before --until" in capsys.readouterr().err


def row(try_number, state, start, end, history=False, run="r1", queued=None):
    from trainyard.scheduling.utilisation import TryRow

    return TryRow("train_pipeline", run, "train", -1, try_number, state, "gpu-a100", 2, start, end, queued, history)


def test_a_retried_try_counts_once_and_the_next_try_waits_without_the_old_dates():
    from trainyard.scheduling.utilisation import allocations_from_rows

    rows = [
        row(1, "up_for_retry", 10, 50, history=True),  # try 1, archived when try 2 was scheduled
        row(2, "queued", 10, 50),  # the live row of try 2 still carries try 1's dates
    ]
    asked = {("train_pipeline", "r1"): 5.0}
    (one,) = allocations_from_rows(rows, asked, {("train_pipeline", "r1"): "vision"})
    assert (one.start, one.end, one.asked, one.first_try, one.team) == (10, 50, 5.0, True, "vision")
    rows.append(row(3, "running", 70, None, history=False))  # try 3 started: a third record, not a new wait
    rows[1] = row(2, "failed", 55, 60, history=True)
    got = sorted(allocations_from_rows(rows, asked, {}), key=lambda a: a.start)
    assert [(a.start, a.end, a.first_try, a.asked) for a in got] == [
        (10, 50, True, 5.0),
        (55, 60, False, None),
        (70, None, False, None),
    ]
    assert report(FLEET, got, 0, 100).pools["a100"].allocated_s == 2 * (40 + 5 + 30)


def test_skipped_and_cancelled_trainings_hold_nothing_and_wait_for_nothing():
    from trainyard.scheduling.utilisation import allocations_from_rows

    rows = [
        row(0, "skipped", 40, 40, run="kubernetes-branch"),  # skipped: start = end = the moment of the skip
        row(0, "upstream_failed", None, 40, run="failed-run"),
        row(0, None, None, None, run="waiting"),  # its admit started: it waits
        row(0, None, None, None, run="data-prep"),  # no admit yet: not waiting for GPUs
    ]
    asked = {("train_pipeline", "waiting"): 20.0, ("train_pipeline", "kubernetes-branch"): 30.0}
    (waiting,) = allocations_from_rows(rows, asked, {})
    assert waiting.run == "train_pipeline/waiting" and waiting.start is None and waiting.asked == 20.0


def test_a_job_that_started_after_a_past_window_was_waiting_in_it():
    records = [alloc("late", "vision", "a100", 1, 150, 160, asked=80)]
    rep = report(FLEET, records, 0, 100)
    assert rep.waiting == 1 and rep.waits["1"].max_s == 20


def test_borrowing_beyond_what_the_others_could_lend_is_a_violation():
    lender = parse_resources("""\
gpu_types:
  a100: {count: 4, price_per_hour: 1.0}
teams:
  vision: {quota: {a100: 2}}
  nlp: {quota: {a100: 2}, lending_limit: {a100: 1}}
""")
    ok = [alloc("a", "vision", "a100", 3, 0, 10)]  # borrows the 1 nlp lends
    assert report(lender, ok, 0, 10).violations == []
    too_much = [alloc("a", "vision", "a100", 4, 0, 10)]  # 2 borrowed, 1 lendable
    assert report(lender, too_much, 0, 10).violations == [
        "a100: teams above their quota held more than the others' lending limits allow (for 10.0 s at most; first at 0)"
    ]


def test_a_runs_team_is_read_from_its_conf_in_either_shape():
    from trainyard.scheduling.utilisation import _conf_team

    assert _conf_team({"resources": {"team": "vision"}}) == "vision"  # REST, trainyard submit
    assert _conf_team({"resources.team": "nlp", "resources.gpu_type": "cpu"}) == "nlp"  # the trigger form
    assert _conf_team({"resources": {"team": "a"}, "resources.team": "b"}) is None  # two teams: none trusted
    assert _conf_team(None) is None and _conf_team({"resources": "x"}) is None


def test_a_preempted_job_counts_each_stint_and_waits_once():
    """Airflow's record of a rescheduled training is its last stint only (its start the last one's); the
    ledger's stints before it are added: all the GPU time held, and one wait, to the first start."""
    from trainyard.scheduling.admission.ledger import Stint
    from trainyard.scheduling.utilisation import allocations_from_rows, with_stints

    run = "train_pipeline/r1"
    asked = {("train_pipeline", "r1"): 5.0}
    resumed = allocations_from_rows([row(1, "success", 70, 90)], asked, {("train_pipeline", "r1"): "vision"})
    assert [(a.start, a.asked) for a in resumed] == [(70, 5.0)]  # as Airflow has it: a 65 s wait, 20 s held
    stints = [Stint(run, "vision", "a100", 2, 40, 60), Stint(run, "vision", "a100", 2, 10, 30)]
    got = sorted(with_stints(resumed, stints), key=lambda a: a.start)
    assert [(a.start, a.end, a.first_try, a.asked, a.team) for a in got] == [
        (10, 30, True, 5.0, "vision"),
        (40, 60, False, None, "vision"),
        (70, 90, False, None, "vision"),
    ]
    rep = report(FLEET, got, 0, 100)
    assert rep.pools["a100"].allocated_s == 2 * (20 + 20 + 20)
    assert rep.waits["2"].max_s == 5  # one wait, to its first start
    # waiting again after its preemption: not a second wait, and its stint counts
    waiting = allocations_from_rows([row(1, "up_for_reschedule", None, None)], asked, {})
    (held,) = with_stints(waiting, stints[1:])
    assert (held.start, held.end, held.first_try, held.asked) == (10, 30, True, 5.0)
    assert with_stints(waiting, []) == waiting  # no stint: Airflow's records as they are


def test_a_preempted_job_s_stints_count_once_for_all_its_nodes_and_not_over_an_earlier_try():
    from trainyard.scheduling.admission.ledger import Stint
    from trainyard.scheduling.utilisation import with_stints

    # a 2-node job: a record per node's task (2 slots each), its stint of all 4 slots counted once
    nodes = [alloc("r1", "vision", "a100", 2, 70, 90, asked=5), alloc("r1", "vision", "a100", 2, 71, 90, asked=5)]
    got = with_stints(nodes, [Stint("r1", "vision", "a100", 4, 10, 30)])
    assert report(FLEET, got, 0, 100).pools["a100"].allocated_s == 4 * 20 + 2 * 20 + 2 * 19
    assert [(a.start, a.asked) for a in got if a.first_try] == [(10, 5)]  # one wait
    # a retry keeps its first try's admission: the stint begins where the failed try's record ends
    tries = [alloc("r2", "nlp", "a100", 2, 10, 20, asked=5), alloc("r2", "nlp", "a100", 2, 50, 60, first=False)]
    got = sorted(with_stints(tries, [Stint("r2", "nlp", "a100", 2, 8, 40)]), key=lambda a: a.start)
    assert [(a.start, a.end, a.first_try, a.asked) for a in got] == [
        (10, 20, True, 5),
        (20, 40, False, None),
        (50, 60, False, None),
    ]
    # a stint whose run has no record in the window (its restart came later) still counts
    (alone,) = with_stints([], [Stint("r3", "nlp", "h100", 1, 10, 30)])
    assert (alone.run, alone.team, alone.start, alone.end, alone.asked) == ("r3", "nlp", 10, 30, None)
