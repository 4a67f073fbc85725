"""The scheduler replay's in-process columns (bench/scheduler.py): the reference, the trace on capacity
alone, which the replayed scenarios are given as ratios to; and trainyard's own policy on the trace."""

import pytest

import checkout
from trainyard.scheduling.resources import ResourcesConfig, load_resources

scheduler_replay = checkout.scheduler_replay()
Job = scheduler_replay.TraceJob


def _fleet(slots: int) -> ResourcesConfig:
    return ResourcesConfig.model_validate(
        {
            "gpu_types": {"h100-80gb": {"count": slots, "price_per_hour": 3.2}},
            "teams": {"a": {"quota": {"h100-80gb": 1}}},
        }
    )


def test_a_job_that_fits_passes_a_larger_one_that_waits_and_no_limit_but_capacity_binds():
    trace = [
        Job("large-first", 0.0, "a", "h100-80gb", 2, 10.0),  # holds 2 of 3 slots until 10
        Job("j1", 1.0, "a", "h100-80gb", 2, 5.0),  # waits for the first: 10 to 15
        Job("j2", 2.0, "a", "h100-80gb", 1, 1.0),  # the slot left: passes j1, starts at once
    ]
    result = scheduler_replay.capacity_reference(_fleet(3), trace, ["h100-80gb"], window=15.0)
    assert result["large_job"] == {"run": "large-first", "slots": 2, "wait_s": 0.0}
    assert result["makespan_s"] == 15.0 and result["violations"] == []
    # 2x10 + 2x5 + 1x1 slot-seconds of 3x15: team a ran far beyond its quota of 1, as nothing stopped it
    assert result["utilisation"] == pytest.approx(31 / 45, abs=1e-4)
    assert result["waits"]["1"] == {"jobs": 1, "p50_s": 0.0, "p95_s": 0.0, "max_s": 0.0}
    assert result["waits"]["2"]["max_s"] == 9.0


def test_the_replays_own_trace_gives_the_figures_the_goal_was_set_against():
    """Seed 7 on the default fleet, as measured by hand when the goal (0.97x its utilisation) was set."""
    fleet = load_resources(None)
    types = ["v100-16gb", "a100-80gb", "h100-80gb"]
    trace = scheduler_replay.make_trace(fleet, types, window=480, load=1.25, median=40, seed=7)
    result = scheduler_replay.capacity_reference(fleet, trace, types, window=480)
    assert (result["utilisation"], result["utilisation_whole"]) == (0.8894, 0.668)
    assert round(result["makespan_s"]) == 979 and round(result["waits"]["1"]["p95_s"]) == 91


def test_the_table_gives_each_scenario_as_a_ratio_to_the_reference_and_says_if_the_goal_is_met():
    trace = [Job("large-a", 0.0, "a", "h100-80gb", 1, 10.0)]
    reference = scheduler_replay.capacity_reference(_fleet(1), trace, ["h100-80gb"], window=10.0)
    replayed = {**reference, "scenario": "trainyard", "utilisation": 0.95, "makespan_s": 12.0}
    table = scheduler_replay.table([replayed, reference])
    assert "  utilisation (submission window)" in table and "0.95x" in table and "1.20x" in table
    assert scheduler_replay.against_the_goal([replayed, reference]) == [
        "trainyard: 0.95x the reference's utilisation (goal 0.97x: missed)"
    ]


def test_the_policy_simulation_keeps_the_teams_limits_that_the_reference_ignores():
    """trainyard's own plan() on the trace, no latency: team a may not borrow, so its second job waits for
    its first although the fleet has room, where the reference starts it at once."""
    fleet = ResourcesConfig.model_validate(
        {
            "gpu_types": {"h100-80gb": {"count": 4, "price_per_hour": 3.2}},
            "teams": {
                "a": {"quota": {"h100-80gb": 2}, "borrowing_limit": {"h100-80gb": 0}},
                "b": {"quota": {"h100-80gb": 2}},
            },
        }
    )
    trace = [Job("large-a", 0.0, "a", "h100-80gb", 2, 10.0), Job("j1", 1.0, "a", "h100-80gb", 2, 5.0)]
    simulated = scheduler_replay.policy_simulation(fleet, trace, ["h100-80gb"], window=15.0)
    reference = scheduler_replay.capacity_reference(fleet, trace, ["h100-80gb"], window=15.0)
    assert simulated["waits"]["2"]["max_s"] == 9.0 and reference["waits"]["2"]["max_s"] == 0.0
    assert simulated["makespan_s"] == 15.0 and simulated["violations"] == []


def test_the_policy_alone_reaches_the_goal_on_the_replays_trace():
    """What the policy costs, apart from Airflow's latencies: on the replay's own trace (seed 7, the wait
    bound scaled as the replay scales it), trainyard's plan() keeps at least the goal's share of the
    reference's utilisation, with no limit broken."""
    fleet = load_resources(None)
    types = ["v100-16gb", "a100-80gb", "h100-80gb"]
    trace = scheduler_replay.make_trace(fleet, types, window=480, load=1.25, median=40, seed=7)
    config = scheduler_replay.scenario_config(fleet, "trainyard", time_scale=60, poll=1.0)
    simulated = scheduler_replay.policy_simulation(config, trace, types, window=480)
    reference = scheduler_replay.capacity_reference(fleet, trace, types, window=480)
    assert simulated["violations"] == [] and simulated["runs"] == {"success": len(trace)}
    assert simulated["utilisation"] >= scheduler_replay.GOAL * reference["utilisation"], simulated["utilisation"]


def test_the_policy_alone_reaches_the_goal_on_other_traces():
    """Not one lucky trace: other seeds and loads of the same generator (a trace each, no Airflow). The
    whole of `bench/scheduler.py --policy-only 1 2 ... 12` (36 traces) gave 0.981x at worst."""
    rows = scheduler_replay.policy_on_traces(
        load_resources(None), ["v100-16gb", "a100-80gb", "h100-80gb"], seeds=[1, 2, 3, 4, 5, 6], loads=[1.0, 1.5],
        window=480, median=40, time_scale=60, poll=1.0,
    )  # fmt: skip
    assert len(rows) == 12 and all(r["violations"] == r["unfinished"] == 0 for r in rows), rows
    assert min(r["ratio"] for r in rows) >= scheduler_replay.GOAL, rows


def test_a_waiting_job_is_told_the_latest_start_it_then_starts_by():
    """The bound a job is told as it first waits (the policy run forward as every running job ends by its
    max_hours, twice its duration in the replay) against when it started, on the policy alone."""
    trace = [
        Job("large-first", 0.0, "a", "h100-80gb", 1, 10.0),  # max_hours: the replay's least, 0.01 h = 36 s
        Job("j1", 1.0, "a", "h100-80gb", 1, 5.0),  # waits for it: told 35 s (its end by 36), starts at 10
    ]
    config = scheduler_replay.scenario_config(_fleet(1), "trainyard", 60.0, 1.0)
    (told,) = scheduler_replay.start_estimates(config, trace, ["h100-80gb"], window=15.0, floor_s=1.0)
    # no job has finished yet: a bound, no expected start
    assert told == {
        "job": "j1",
        "wait_s": 9.0,
        "told_after_s": 0.0,
        "bound_s": pytest.approx(35.0, abs=0.1),
        "expected_s": None,
        "early_s": None,
        "late_s": None,
    }


def test_with_preemption_the_policy_breaks_no_limit_finishes_every_job_and_loses_little():
    """Preemption as the ledger applies it, on the replay's trace: lenders take their quota back (the
    borrowers stop, wait again and resume with 2 trace seconds lost), with no limit broken, every job
    finished, no job preempted more than resources.yaml's max_preemptions, and at most 1 % of the trace's
    GPU-seconds lost (`bench/scheduler.py --policy-only ... --preemption` gives the figures per trace)."""
    fleet = load_resources(None)
    types = ["v100-16gb", "a100-80gb", "h100-80gb"]
    rows = scheduler_replay.preemption_on_traces(
        fleet, types, seeds=[7], loads=[1.25], window=480, median=40, time_scale=60, poll=1.0
    )
    off, on = rows
    assert (off["preemption"], on["preemption"]) == ("off", "on")
    assert off["preemptions"] == 0 and on["preemptions"] > 0
    for r in rows:
        assert r["violations"] == r["unfinished"] == 0, r
        assert r["ratio"] >= scheduler_replay.GOAL, r
    assert on["most_preemptions_of_a_job"] <= fleet.scheduling.preemption.max_preemptions
    assert on["gpu_seconds_lost_share"] <= 0.01, on
