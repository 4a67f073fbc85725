"""Two rules of the policy, pure. Preemption (``reclaim``): a job within its team's nominal quota reclaims
what other teams borrow of it, from the fewest borrowers, the lowest priority and the most recently admitted
first, never from a job that has run less than the minimum or was preempted too often, nor from a sweep's
trial, and never to borrow itself; within a team, a higher priority preempts a lower one where the team's
policy says so; ``plan`` preempts only when asked to (the ledger asks as resources.yaml
says: tests/unit/scheduling/test_admission.py). The latest start
(``latest_starts``): the policy run forward as the admitted jobs end by their max_hours."""

from __future__ import annotations

from trainyard.scheduling.admission.policy import (
    MAX_RECLAIM_CANDIDATES,
    Entry,
    Job,
    PreemptionRules,
    Standing,
    WaitReason,
    plan,
    reclaim,
)
from trainyard.scheduling.resources import parse_resources

# a100: 8 slots; vision's quota 4, nlp's 4; nlp may borrow vision's idle quota
FLEET = parse_resources(
    "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
    "teams:\n  vision: {quota: {a100: 4}}\n  nlp: {quota: {a100: 4}}\n  research: {quota: {a100: 0}}\n"
)
NOW = 100_000.0
RULES = PreemptionRules(min_runtime_s=600.0, max_preemptions=2)


def _running(
    job_id: str, team: str, slots: int, priority: int = 1, ran_s: float = 3600.0, borrowed: int = 0, **kw
) -> Entry:
    job = Job(job_id, team, "a100", slots, priority, 24.0)
    return Entry(job, NOW - ran_s - 60, NOW - ran_s, borrowed, NOW + 180, **kw)


def _waiting(job_id: str, team: str, slots: int) -> Entry:
    return Entry(Job(job_id, team, "a100", slots, 1, 24.0), NOW - 30, None, 0, NOW + 120)


def _used(entries: list[Entry]) -> dict[str, int]:
    used = dict.fromkeys(FLEET.teams, 0)
    for e in entries:
        if e.admitted is not None:
            used[e.job.team] += e.job.slots
    return used


def test_a_lender_within_its_quota_preempts_the_fewest_borrowers_lowest_priority_then_newest_first():
    running = [
        _running("nlp/own", "nlp", 4),  # nlp's own quota: never preempted for vision
        _running("nlp/old", "nlp", 2, priority=1, ran_s=7200, borrowed=2),
        _running("nlp/new", "nlp", 2, priority=1, ran_s=1200, borrowed=2),
    ]
    lender = _waiting("vision/a", "vision", 2)
    victims = reclaim(FLEET, running, lender.job, _used(running), NOW, RULES)
    assert [v.job.id for v in victims] == ["nlp/new"]  # one job frees enough: the most recently admitted
    # the lowest priority goes first, whatever its age
    running[1] = _running("nlp/old", "nlp", 2, priority=1, ran_s=7200, borrowed=2)
    running[2] = _running("nlp/new", "nlp", 2, priority=5, ran_s=1200, borrowed=2)
    assert [v.job.id for v in reclaim(FLEET, running, lender.job, _used(running), NOW, RULES)] == ["nlp/old"]
    # a job that needs all four: both borrowers, not nlp's own
    big = _waiting("vision/b", "vision", 4)
    assert sorted(v.job.id for v in reclaim(FLEET, running, big.job, _used(running), NOW, RULES)) == [
        "nlp/new",
        "nlp/old",
    ]


def test_no_preemption_to_borrow_for_a_job_just_started_or_preempted_too_often():
    running = [_running("nlp/own", "nlp", 4), _running("nlp/borrows", "nlp", 4, borrowed=4)]
    # vision holds 2 of its 4 and asks for 4 more: it would borrow, so it reclaims nothing
    vision = [_running("vision/x", "vision", 2), *running]
    assert reclaim(FLEET, vision, Job("vision/y", "vision", "a100", 4, 1, 24.0), _used(vision), NOW, RULES) is None
    fresh = [
        _running("nlp/own", "nlp", 4),
        _running("nlp/borrows", "nlp", 4, ran_s=60, borrowed=4),
    ]  # within the minimum
    lender = Job("vision/a", "vision", "a100", 2, 1, 24.0)
    assert reclaim(FLEET, fresh, lender, _used(fresh), NOW, RULES) is None
    protected = [_running("nlp/own", "nlp", 4), _running("nlp/borrows", "nlp", 4, borrowed=4, preemptions=2)]
    assert reclaim(FLEET, protected, lender, _used(protected), NOW, RULES) is None
    # a sweep's trial: its task run again would train a new trial, so it is not preempted
    trial = Entry(Job("nlp/sweep/slot-0", "nlp", "a100", 4, 1, 24.0, group="nlp/sweep"), NOW - 4000, NOW - 3600, 4, NOW)
    assert reclaim(FLEET, [running[0], trial], lender, _used([running[0], trial]), NOW, RULES) is None


def test_plan_with_preemption_says_who_preempts_whom_and_the_lender_waits_for_them():
    entries = [
        _running("nlp/own", "nlp", 4),
        _running("nlp/borrows", "nlp", 4, borrowed=4),
        _waiting("vision/a", "vision", 2),
    ]
    without = plan(FLEET, entries, NOW)
    assert without["vision/a"].reason is WaitReason.SLOTS_IN_USE and "nlp/borrows" not in without  # as before
    verdicts = plan(FLEET, entries, NOW, preemption=RULES)
    lender, victim = verdicts["vision/a"], verdicts["nlp/borrows"]
    assert lender.standing is Standing.WAITING and lender.reason is WaitReason.PREEMPTING
    assert lender.message == (
        "reclaiming 4 a100 slot(s) of team vision's quota from team nlp's job of 4 a100 slot(s); "
        "it starts when they have stopped"
    )
    assert (
        victim.standing is Standing.PREEMPTED and "preempted for team vision's job of 2 a100 slot(s)" in victim.message
    )
    # while the victim checkpoints, the lender's next look waits for it and preempts nothing more
    marked = [entries[0], Entry(**{**vars(entries[1]), "preempted_for": "vision/a"}), entries[2]]
    again = plan(FLEET, marked, NOW + 10, preemption=RULES)
    assert again["vision/a"].reason is WaitReason.PREEMPTING and set(again) == {"vision/a", "nlp/borrows"}
    # a job that would borrow preempts nobody: it waits for slots as before
    behind = [*entries, _waiting("research/r", "research", 2)]
    assert plan(FLEET, behind, NOW, preemption=RULES)["research/r"].reason is WaitReason.SLOTS_IN_USE


def test_each_waiting_job_has_the_latest_time_it_starts_by_if_the_running_ones_use_all_their_hours():
    from trainyard.scheduling.admission.starts import latest_starts

    hour = 3600.0
    running = [  # 8 of 8 a100 in use: ends in 1 h (of its 24), in 2 h, and one past its max_hours
        Entry(Job("nlp/a", "nlp", "a100", 4, 1, 24.0), NOW - 23 * hour, NOW - 23 * hour, 0, NOW + 180),
        Entry(Job("vision/b", "vision", "a100", 2, 1, 3.0), NOW - hour, NOW - hour, 0, NOW + 180),
        Entry(Job("vision/c", "vision", "a100", 2, 1, 1.0), NOW - 2 * hour, NOW - 2 * hour, 0, NOW + 180),
    ]
    waiting = [
        _waiting("vision/first", "vision", 2),  # vision/c's 2 slots, free now (it is past its bound)
        _waiting("nlp/big", "nlp", 4),  # nlp/a's 4, in an hour
        _waiting("vision/later", "vision", 2),  # vision/b's, in 2 h
        _waiting("research/never", "research", 9),  # more than the type has: never
    ]
    starts = latest_starts(FLEET, running + waiting, NOW)
    assert starts == {"vision/first": NOW, "nlp/big": NOW + hour, "vision/later": NOW + 2 * hour}
    assert latest_starts(FLEET, running, NOW) == {}  # nobody waits


def test_of_a_long_queue_only_the_first_jobs_of_each_type_are_given_a_start():
    from trainyard.scheduling.admission.starts import WAITING_IN_SIGHT, estimate_starts, start_in_words

    queue = [
        Entry(Job(f"vision/{i:04d}", "vision", "a100", 1, 1, 24.0), NOW - 1000 + i, None, 0, NOW + 120)
        for i in range(WAITING_IN_SIGHT + 11)
    ]
    starts = estimate_starts(FLEET, queue, NOW)
    # the 8 that fit now and the next 100 in arrival order are placed; the last 3 are too far back
    placed = sorted(job_id for job_id, start in starts.items() if not start.behind)
    assert placed == [f"vision/{i:04d}" for i in range(WAITING_IN_SIGHT + 8)] and len(starts) == len(queue)
    assert starts["vision/0000"].latest == NOW and starts["vision/0008"].latest == NOW + 24 * 3600
    assert start_in_words(starts["vision/0000"], NOW) == "starts at its next look"
    assert start_in_words(None, NOW).startswith("no start in sight")


def test_the_fewest_borrowers_are_found_whatever_their_order_and_no_team_loses_its_own_quota():
    # nlp: quota 4, holds 6 (b1 and b2 borrowed one slot each, c is within); research: quota 0, holds 2
    two_teams = [
        _running("nlp/c", "nlp", 4),
        _running("nlp/b1", "nlp", 1, priority=1, borrowed=1),
        _running("nlp/b2", "nlp", 1, priority=1, borrowed=1),
        _running("research/b", "research", 2, priority=2, borrowed=2),
    ]
    lender = Job("vision/a", "vision", "a100", 2, 1, 24.0)
    victims = reclaim(FLEET, two_teams, lender, _used(two_teams), NOW, RULES)
    assert [v.job.id for v in victims] == ["research/b"]  # one job frees both slots
    four = Job("vision/b", "vision", "a100", 4, 1, 24.0)
    assert sorted(v.job.id for v in reclaim(FLEET, two_teams, four, _used(two_teams), NOW, RULES)) == [
        "nlp/b1",
        "nlp/b2",
        "research/b",
    ]
    # a job admitted on a borrowed slot whose team would fall below its quota without it is not taken
    partly = [_running("nlp/c", "nlp", 3), _running("nlp/d", "nlp", 2, borrowed=1)]
    assert reclaim(FLEET, partly, Job("vision/a", "vision", "a100", 4, 1, 24.0), _used(partly), NOW, RULES) is None


def test_two_waiting_jobs_never_claim_the_same_borrower_and_a_budget_keeps_a_job_from_preempting():
    entries = [
        _running("nlp/own", "nlp", 4),
        _running("nlp/b1", "nlp", 2, borrowed=2),
        _running("nlp/b2", "nlp", 2, borrowed=2, ran_s=60),  # within the minimum run: not yet
        _waiting("vision/a", "vision", 2),
        _waiting("vision/b", "vision", 2),
    ]
    verdicts = plan(FLEET, entries, NOW, preemption=RULES)
    assert verdicts["vision/a"].reason is WaitReason.PREEMPTING and verdicts["nlp/b1"].standing is Standing.PREEMPTED
    assert verdicts["vision/b"].reason is WaitReason.SLOTS_IN_USE  # nlp/b1 is vision/a's; nothing else may go

    from trainyard.scheduling.budgets import Spend

    budgeted = parse_resources(
        "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 4}, monthly_budget: 10}\n  nlp: {quota: {a100: 4}}\n"
    )
    poor = Spend(this_month={"vision": 0.0}, of_run=lambda run: 0.0)  # 24 h x 2 x $2 = $96 > $10
    held = plan(budgeted, entries[:4], NOW, poor, preemption=RULES)
    assert held["vision/a"].reason is WaitReason.SLOTS_IN_USE and "nlp/b1" not in held


def test_a_job_its_budget_holds_back_is_given_no_start():
    from trainyard.scheduling.admission.starts import latest_starts
    from trainyard.scheduling.budgets import Spend

    budgeted = parse_resources(
        "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 4}, monthly_budget: 10}\n  nlp: {quota: {a100: 4}}\n"
    )
    queue = [_waiting("vision/a", "vision", 2), _waiting("nlp/a", "nlp", 2)]
    poor = Spend(this_month={"vision": 0.0}, of_run=lambda run: 0.0)  # vision's job may cost $96 of its $10
    assert latest_starts(budgeted, queue, NOW, poor) == {"nlp/a": NOW}


def test_within_a_team_a_higher_priority_preempts_a_lower_one_only_where_its_policy_says_so():
    fleet = parse_resources(
        "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 4}, borrowing_limit: {a100: 0}}\n  nlp: {quota: {a100: 4}}\n"
    )
    allowed = parse_resources(
        "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
        "teams:\n  vision: {quota: {a100: 4}, borrowing_limit: {a100: 0}, policy: {preempt_by_priority: true}}\n"
        "  nlp: {quota: {a100: 4}}\n"
    )
    entries = [
        _running("vision/old", "vision", 2, priority=1, ran_s=7200),
        _running("vision/new", "vision", 2, priority=1, ran_s=1200),
        _running("nlp/own", "nlp", 4, priority=1),
        Entry(Job("vision/urgent", "vision", "a100", 2, 9, 24.0), NOW - 30, None, 0, NOW + 120),
    ]
    assert plan(fleet, entries, NOW, preemption=RULES)["vision/urgent"].reason is WaitReason.BORROWING_LIMIT
    verdicts = plan(allowed, entries, NOW, preemption=RULES)
    assert verdicts["vision/urgent"].reason is WaitReason.PREEMPTING
    assert verdicts["vision/new"].standing is Standing.PREEMPTED  # the most recently admitted of the lowest
    assert "vision/old" not in verdicts and "nlp/own" not in verdicts
    # the same priority preempts nobody: it waits for its team's jobs as before
    same = [*entries[:3], Entry(Job("vision/peer", "vision", "a100", 2, 1, 24.0), NOW - 30, None, 0, NOW + 120)]
    assert plan(allowed, same, NOW, preemption=RULES)["vision/peer"].reason is WaitReason.BORROWING_LIMIT


def test_what_a_decision_remembers_changes_no_verdict(monkeypatch):
    """``plan`` remembers, within one type's decision, a team's room for a size and that a job reclaims
    nothing (``_DecisionMemo``): on random queues, with and without preemption, every verdict is the one
    the policy gives when it remembers nothing."""
    import random

    from trainyard.scheduling.admission import policy

    fleet = parse_resources(
        "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n  h100: {count: 4, price_per_hour: 3.0}\n"
        "teams:\n  vision: {quota: {a100: 4, h100: 2}, borrowing_limit: {a100: 2}}\n"
        "  nlp: {quota: {a100: 4}, lending_limit: {a100: 1}, policy: {preempt_by_priority: true}}\n"
        "  research: {quota: {h100: 2}}\nscheduling:\n  max_wait_minutes: 30\n"
    )

    class Forgetful(policy._DecisionMemo):
        def room(self, config, used, job):
            return policy._room(config, used, job)

        def preempting(self, config, holding, job, *args):
            return policy._preempting(config, holding, job, *args)

    rng = random.Random(5)
    for _ in range(300):
        entries = []
        for i in range(rng.randint(1, 30)):
            team, gpu_type = rng.choice(["vision", "nlp", "research"]), rng.choice(["a100", "h100"])
            job = Job(f"{team}/{i}", team, gpu_type, rng.choice([1, 1, 2, 4]), rng.choice([1, 5, 9]), 1.0)
            admitted = NOW - rng.uniform(0, 7200) if rng.random() < 0.4 else None
            entries.append(Entry(job, NOW - rng.uniform(0, 4000), admitted, rng.choice([0, 0, 1, 2]), NOW + 180))
        for rules in (None, RULES):
            remembered = plan(fleet, entries, NOW, preemption=rules)
            with monkeypatch.context() as m:
                m.setattr(policy, "_DecisionMemo", Forgetful)
                assert plan(fleet, entries, NOW, preemption=rules) == remembered


def test_a_lender_whose_borrowers_hold_its_quota_in_more_pieces_than_are_searched_takes_them_in_order():
    """More victims than the first MAX_RECLAIM_CANDIDATES: the lender still reclaims its quota, from the
    borrowers in preemption order (the lowest priority, then the most recently admitted), no more than it
    needs. (20 one-slot jobs, once found waiting for all of them to end.)"""
    fleet = parse_resources(
        "gpu_types:\n  cpu: {count: 21, price_per_hour: 0}\n"
        "teams:\n  default: {quota: {cpu: 21}}\n  vision: {quota: {cpu: 0}}\n"
    )
    assert MAX_RECLAIM_CANDIDATES < 20
    borrowers = [
        Entry(Job(f"vision/{i:02d}", "vision", "cpu", 1, 1 + i % 2, 24.0), NOW - 4000, NOW - 3600 + i, 1, NOW)
        for i in range(20)
    ]
    used = {"default": 0, "vision": 20}
    everything = reclaim(fleet, borrowers, Job("default/all", "default", "cpu", 21, 1, 24.0), used, NOW, RULES)
    assert sorted(v.job.id for v in everything) == [f"vision/{i:02d}" for i in range(20)]
    entries = [*borrowers, Entry(Job("default/all", "default", "cpu", 21, 1, 24.0), NOW - 30, None, 0, NOW + 120)]
    said = plan(fleet, entries, NOW, preemption=RULES)["default/all"]
    assert said.message.startswith(  # the same description once, with how many
        "reclaiming 20 cpu slot(s) of team default's quota from 20 x team vision's job of 1 cpu slot(s); "
    ), said.message
    # 15 wanted, 1 free: 14 of them, priority 1 first (the even ones), the most recently admitted first
    some = reclaim(fleet, borrowers, Job("default/some", "default", "cpu", 15, 1, 24.0), used, NOW, RULES)
    evens, odds = [f"vision/{i:02d}" for i in range(18, -1, -2)], [f"vision/{i:02d}" for i in range(19, 0, -2)]
    assert [v.job.id for v in some] == evens + odds[:4]
    # borrowers protected by the minimum runtime are passed over: 14 may go, enough for 15 slots, not for 21
    fresh = [*borrowers[:14], *(Entry(b.job, NOW - 100, NOW - 60, 1, NOW) for b in borrowers[14:])]
    assert reclaim(fleet, fresh, Job("default/all", "default", "cpu", 21, 1, 24.0), used, NOW, RULES) is None
    some = reclaim(fleet, fresh, Job("default/some", "default", "cpu", 15, 1, 24.0), used, NOW, RULES)
    assert sorted(v.job.id for v in some) == [f"vision/{i:02d}" for i in range(14)]


def test_beyond_the_searched_candidates_only_the_victims_needed_are_preempted():
    """The walk in preemption order keeps only what the lender needs: another team's borrowers of a lower
    priority come first in that order but free nothing of the lender's own team's quota, and of many small
    borrowers only as many go as, with a big one, free enough."""
    fleet = parse_resources(
        "gpu_types:\n  cpu: {count: 33, price_per_hour: 0}\n"
        "teams:\n  a: {quota: {cpu: 20}, policy: {preempt_by_priority: true}}\n  b: {quota: {cpu: 13}}\n"
        "  c: {quota: {cpu: 0}}\n"
    )
    own = [
        Entry(Job("a/low", "a", "cpu", 4, 50, 24.0), NOW - 4000, NOW - 3600, 0, NOW),
        Entry(Job("a/high", "a", "cpu", 16, 200, 24.0), NOW - 4000, NOW - 3600, 0, NOW),
    ]
    # team c borrows b's whole idle quota in 13 one-slot jobs of priority 1: first in preemption order
    borrowers = [
        Entry(Job(f"c/{i:02d}", "c", "cpu", 1, 1, 24.0), NOW - 4000, NOW - 3600 + i, 1, NOW) for i in range(13)
    ]
    used = {"a": 20, "b": 0, "c": 13}
    lender = Job("a/new", "a", "cpu", 4, 100, 24.0)  # a is at its quota: only a/low's 4 slots make room
    assert [v.job.id for v in reclaim(fleet, [*own, *borrowers], lender, used, NOW, RULES)] == ["a/low"]

    # twelve one-slot borrowers, then (admitted first, so last in the order) one of 8; 13 wanted, none free
    fleet = parse_resources(
        "gpu_types:\n  cpu: {count: 20, price_per_hour: 0}\nteams:\n  a: {quota: {cpu: 20}}\n  c: {quota: {cpu: 0}}\n"
    )
    small = [Entry(Job(f"c/{i:02d}", "c", "cpu", 1, 1, 24.0), NOW - 4000, NOW - 3000 - i, 1, NOW) for i in range(12)]
    big = Entry(Job("c/big", "c", "cpu", 8, 1, 24.0), NOW - 9000, NOW - 8000, 8, NOW)
    victims = reclaim(fleet, [*small, big], Job("a/x", "a", "cpu", 13, 1, 24.0), {"a": 0, "c": 20}, NOW, RULES)
    assert [v.job.id for v in victims] == ["c/00", "c/01", "c/02", "c/03", "c/04", "c/big"]
