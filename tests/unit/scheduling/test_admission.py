"""The admission ledger: capacity, quotas, borrowing and lending, order, the bound on a large job's wait,
leases that free what a dead process held, and one consistent order across concurrent processes. Every
test of the ledger's rules runs against both of its stores: a SQLite file (the embedded default) and a
PostgreSQL database (the cluster profile; a real server this session starts)."""

import dataclasses
import random
import time

import pytest

from processes import in_processes
from trainyard.errors import Preempted
from trainyard.scheduling.admission.lease import AdmissionLost, hold
from trainyard.scheduling.admission.ledger import (
    ADMITTED_LEASE_S,
    LEDGER_FILE,
    RUNNING_LEASE_S,
    WAITING_LEASE_S,
    Ledger,
    NoFreeDevices,
    NotAdmitted,
    Stint,
    default_ledger,
)
from trainyard.scheduling.admission.policy import Entry, Job, Standing, WaitReason, plan
from trainyard.scheduling.resources import max_reach, parse_resources

FLEET = """\
gpu_types:
  a100: {count: 8, price_per_hour: 1.0}
teams:
  vision: {quota: {a100: 4}, borrowing_limit: {a100: 2}}
  nlp: {quota: {a100: 2}}
  research: {quota: {a100: 2}, lending_limit: {a100: 1}}
  lab: {}
scheduling:
  max_wait_minutes: 10
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """Where a test's ledgers live, by name: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return lambda name: tmp_path / f"{name}.db"
    postgres = request.getfixturevalue("postgres")
    return lambda name: postgres.database(f"ledger_{name}".replace("-", "_"))


@pytest.fixture
def ledger(store, clock):
    return Ledger(store("admission"), parse_resources(FLEET), clock)


def job(name: str, team: str, slots: int, priority: int = 1) -> Job:
    return Job(name, team, "a100", slots, priority, max_hours=1.0)


def admitted(ledger: Ledger) -> dict[str, int]:
    return {e.job.id: e.borrowed for e in ledger.entries() if e.admitted is not None}


def test_quota_then_borrowing_within_the_limits(ledger):
    assert ledger.request(job("v1", "vision", 4)).admitted
    # vision may borrow 2 beyond its 4 (nlp lends all of its idle quota, research 1 of its 2)
    assert ledger.request(job("v2", "vision", 2)).admitted
    refused = ledger.request(job("v3", "vision", 1))
    assert not refused.admitted and "may borrow at most 2" in refused.message
    assert refused.reason is WaitReason.BORROWING_LIMIT
    assert admitted(ledger) == {"v1": 0, "v2": 2}
    # lab has no quota: of research's idle 2 it may borrow the 1 research lends, not the other
    assert ledger.request(job("l1", "lab", 1)).admitted
    l2 = ledger.request(job("l2", "lab", 1))
    assert not l2.admitted and "would borrow 1 slots, 0 are lendable now" in l2.message
    assert l2.reason is WaitReason.NOT_LENDABLE
    assert ledger.request(job("r1", "research", 1)).admitted  # what research kept for itself
    full = ledger.request(job("n1", "nlp", 1))
    assert not full.admitted and "8 of 8 slots in use" in full.message
    assert full.reason is WaitReason.SLOTS_IN_USE


def test_lent_quota_comes_back_as_borrowers_finish(ledger):
    assert ledger.request(job("v1", "vision", 4)).admitted
    assert ledger.request(job("v2", "vision", 2)).admitted  # borrows nlp's idle 2
    assert ledger.request(job("r1", "research", 1)).admitted
    assert ledger.request(job("r2", "research", 1)).admitted  # the fleet is full
    assert not ledger.request(job("n1", "nlp", 2)).admitted  # its quota is lent out; nothing is preempted
    ledger.release("r1")  # one slot free: n1 needs 2, and while it waits for its own quota ...
    lab = ledger.request(job("l1", "lab", 1))
    assert (
        not lab.admitted and "no borrowing while team nlp's job of 2 a100 slot(s) waits" in lab.message
    )  # ... no one borrows the free slot
    assert lab.reason is WaitReason.NO_BORROWING
    ledger.release("r2")
    assert ledger.request(job("l1", "lab", 1)).admitted is False  # n1 is first in line for the 2 free slots
    n1 = ledger.request(job("n1", "nlp", 2))  # but they are research's: it lends 1 and keeps 1 for itself
    assert not n1.admitted and "the free slots are other teams' reserve" in n1.message
    assert n1.reason is WaitReason.QUOTA_LENT_OUT
    ledger.release("v2")
    assert ledger.request(job("n1", "nlp", 2)).admitted  # its next look: its quota came back as v2 finished


def test_priority_then_arrival_among_waiting_jobs(ledger, clock):
    assert ledger.request(job("big", "vision", 4)).admitted
    assert ledger.request(job("n", "nlp", 2)).admitted
    assert ledger.request(job("r", "research", 2)).admitted  # the fleet is full
    for name, prio in (("early", 5), ("late-high", 9), ("late-low", 5)):
        clock.now += 1
        assert not ledger.request(job(name, "vision", 4, prio)).admitted
    ledger.release("big")
    assert not ledger.request(job("early", "vision", 4, 5)).admitted  # its look admits the first in line ...
    assert "late-high" in admitted(ledger)  # ... which is the higher priority
    ledger.release("late-high")
    assert not ledger.request(job("late-low", "vision", 4, 5)).admitted
    assert "early" in admitted(ledger)  # same priority: the earlier arrival


STREAM = """\
gpu_types:
  a100: {count: 8, price_per_hour: 1.0}
teams:
  vision: {quota: {a100: 4}}
  nlp: {quota: {a100: 4}}
scheduling:
  max_wait_minutes: MAX_WAIT
"""


def _large_job_start(store, clock, max_wait: int, minutes: int = 30) -> int | None:
    """The minute a 4-slot job starts while its team's 1-slot jobs keep the fleet full (with nlp's idle
    quota): every minute the oldest running one ends and two arrive, so a free slot is always wanted by a
    small job that fits. Every waiting job asks again each minute, as its admit task does; running ones
    renew their lease."""
    cfg = parse_resources(STREAM.replace("MAX_WAIT", str(max_wait)))
    ledger = Ledger(store(f"stream-{max_wait}"), cfg, clock)
    jobs = [job(f"s{i}", "vision", 1) for i in range(8)]  # vision's quota and nlp's idle one, lent
    for j in jobs:
        assert ledger.request(j).admitted
    large = job("large", "vision", 4)
    for minute in range(1, minutes):
        clock.now += 60
        live = {e.job.id: e for e in ledger.entries()}
        if ledger.request(large).admitted:
            return minute
        oldest = min((e for e in live.values() if e.admitted is not None), key=lambda e: e.admitted)
        ledger.release(oldest.job.id)
        jobs += [job(f"s{minute}-{k}", "vision", 1) for k in range(2)]
        for j in jobs:
            entry = live.get(j.id)
            if entry is None or entry.admitted is None:
                ledger.request(j)
            else:
                ledger.renew(j.id)
        jobs = [j for j in jobs if j.id != oldest.job.id]
    return None


def test_a_large_job_waits_at_most_the_bound_behind_a_stream_of_small_ones(store, clock):
    assert _large_job_start(store, clock, max_wait=10_000) is None  # no bound: the small ones pass it forever
    # it arrives at minute 1; past the bound (5 min) no small job starts, and it starts once 4 running ones
    # have ended (one a minute here)
    started = _large_job_start(store, clock, max_wait=5)
    assert started is not None and 5 < started - 1 <= 5 + 4, started


def test_a_job_that_cannot_delay_the_starving_one_still_starts(store, clock):
    """Past the bound, the large job holds a reservation: the time its slots are free if every running job
    ends by its max_hours. A job that ends before it, or takes a slot the large job will not need, starts
    (EASY backfill); one that could push the reservation back waits."""
    ledger = Ledger(store("backfill"), parse_resources(STREAM.replace("MAX_WAIT", "5")), clock)

    def limited(name: str, slots: int, minutes: float) -> Job:
        return Job(name, "vision", "a100", slots, 1, max_hours=minutes / 60)

    for i in range(2):  # 2 slots until minute 60 at the latest
        assert ledger.request(limited(f"long{i}", 1, 60)).admitted
    for i in range(5):  # 5 until minute 20: with the free one, the large job's 6 slots are free then
        assert ledger.request(limited(f"short{i}", 1, 20)).admitted
    large = limited("large", 6, 30)
    assert not ledger.request(large).admitted
    clock.now += 6 * 60  # past the bound; 1 slot free, the reservation at minute 20
    assert not ledger.request(large).admitted
    too_long = ledger.request(limited("too-long", 1, 30))  # ends at minute 36: the large job could not start at 20
    assert not too_long.admitted and "behind team vision's job of 6 a100 slot(s)" in too_long.message
    assert too_long.reason is WaitReason.RESERVATION
    assert ledger.request(limited("fits-before", 1, 10)).admitted  # ends by minute 16
    ledger.release("long0")  # 1 slot free again; at minute 20: 3 + 1 free, 2 more than the large job needs
    assert ledger.request(limited("spare", 1, 60)).admitted  # a slot the large job will not need
    for i in range(5):
        ledger.release(f"short{i}")
    ledger.release("fits-before")
    assert ledger.request(large).admitted


def _entries(now: float, running: list[tuple[str, str, int, float]], starving: tuple, arriving: tuple):
    """Ledger rows for :func:`plan`, each (name, team, slots, minutes of max_hours): the running
    ones admitted now, ``starving`` arrived an hour ago (past the bound), ``arriving`` a moment ago."""

    def row(job: tuple, enqueued: float, admitted: float | None) -> Entry:
        name, team, slots, minutes = job
        return Entry(Job(name, team, "a100", slots, 1, minutes / 60), enqueued, admitted, 0, now + 60)

    return [*(row(j, now, now) for j in running), row(starving, now - 3600, None), row(arriving, now - 1, None)]


def test_no_job_passes_a_starving_one_that_a_team_limit_would_then_stop():
    """The reservation is kept by every rule, not only the slots: a job of the starving one's team that
    would still run at the reserved start, with the team's borrowing limit then binding, waits."""
    fleet = parse_resources(
        "gpu_types: {a100: {count: 8, price_per_hour: 1.0}}\n"
        "teams: {vision: {quota: {a100: 4}, borrowing_limit: {a100: 2}}, nlp: {quota: {a100: 4}}}\n"
        "scheduling: {max_wait_minutes: 5}\n"
    )
    running = [*((f"long{i}", "vision", 1, 60) for i in range(3)), *((f"short{i}", "nlp", 1, 20) for i in range(4))]
    starving = ("large", "vision", 3, 30)  # 3 + 3 is vision's most; its slots are free at minute 20
    now = 1_000_000.0
    verdicts = plan(fleet, _entries(now, running, starving, ("stays", "vision", 1, 60)), now)
    assert not verdicts["large"].admitted and not verdicts["stays"].admitted, verdicts  # 3 + 1 + 3 > 6 at minute 20
    assert "behind team vision's job of 3 a100 slot(s)" in verdicts["stays"].message
    verdicts = plan(fleet, _entries(now, running, starving, ("ends-first", "vision", 1, 10)), now)
    assert verdicts["ends-first"].admitted, verdicts  # gone by minute 20


def test_no_borrower_passes_a_starving_one_that_the_lending_limits_hold_back():
    """A starving job that waits for lendable slots, not for free ones, has no reservation to backfill
    around: no borrower passes it, as it would take what the starving one waits for."""
    fleet = parse_resources(
        "gpu_types: {a100: {count: 10, price_per_hour: 1.0}}\n"
        "teams: {vision: {quota: {a100: 2}}, nlp: {quota: {a100: 8}, lending_limit: {a100: 4}}, ml: {}}\n"
        "scheduling: {max_wait_minutes: 5}\n"
    )
    running = [("own", "vision", 2, 60), ("borrower", "ml", 2, 60)]  # 2 of nlp's 4 lendable slots lent
    now = 1_000_000.0
    verdicts = plan(fleet, _entries(now, running, ("large", "vision", 4, 30), ("more", "ml", 2, 5)), now)
    assert not verdicts["large"].admitted and "lendable" in verdicts["large"].message, verdicts
    assert not verdicts["more"].admitted and "behind team vision's job of 4 a100 slot(s)" in verdicts["more"].message, (
        verdicts
    )


def test_a_killed_holder_frees_its_slots_when_its_lease_runs_out(ledger, clock):
    assert ledger.request(job("a", "vision", 4)).admitted
    assert ledger.request(job("b", "nlp", 2)).admitted
    assert ledger.request(job("c", "research", 2)).admitted
    assert not ledger.request(job("d", "vision", 2)).admitted
    ledger.renew("a")
    clock.now += ADMITTED_LEASE_S + 1  # no heartbeat from a, b or c since: their workers were killed
    assert ledger.request(job("d", "vision", 2)).admitted
    assert set(admitted(ledger)) == {"d"}


def test_a_waiting_job_whose_run_was_cancelled_leaves_the_queue(ledger, clock):
    assert ledger.request(job("a", "vision", 4)).admitted
    assert ledger.request(job("b", "nlp", 2)).admitted
    assert ledger.request(job("c", "research", 2)).admitted
    assert not ledger.request(job("gone", "vision", 2, priority=9)).admitted
    clock.now += WAITING_LEASE_S + 1
    ledger.renew("a"), ledger.renew("b"), ledger.renew("c")
    assert "gone" not in {e.job.id for e in ledger.entries()}


def test_a_job_whose_team_or_gpu_type_left_resources_yaml_is_refused_not_told_to_wait(ledger, clock):
    """It was "waiting" for up to 7 days: now it is refused at its look, naming what is gone, and queues
    nothing (a row it had is dropped, so it holds no place); its training's hold fails for good too."""
    from trainyard.errors import PermanentError

    assert not ledger.request(job("big", "vision", 8)).admitted  # vision may hold 6: it waits, with a row
    ledger.config = parse_resources(FLEET.replace("  vision: {quota: {a100: 4}, borrowing_limit: {a100: 2}}\n", ""))
    said = ledger.request(job("big", "vision", 8))
    assert said.standing is Standing.INADMISSIBLE and said.final and not said.admitted
    assert said.message.startswith("inadmissible: team 'vision' is not in resources.yaml")
    assert "big" not in {e.job.id for e in ledger.entries()}
    typo = ledger.request(Job("typo", "nlp", "a1OO", 1, 1, max_hours=1.0))
    assert typo.standing is Standing.INADMISSIBLE and "GPU type 'a1OO' is not in resources.yaml" in typo.message
    with pytest.raises(PermanentError, match="inadmissible: team 'vision'"), hold(ledger, job("big", "vision", 2)):
        pass


def test_hold_renews_while_training_and_releases_at_the_end(ledger, clock):
    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    with hold(ledger, j, heartbeat_s=0.01):
        for _ in range(3):  # 3 x 150 s: past the 180 s lease, alive by the heartbeat alone
            clock.now += 150
            time.sleep(0.2)
            assert "a" in admitted(ledger)
    assert ledger.entries() == []


def test_a_failed_try_keeps_its_admission_for_the_retry_and_a_permanent_failure_does_not(ledger, clock):
    from trainyard.errors import PermanentError

    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    with pytest.raises(RuntimeError), hold(ledger, j):
        raise RuntimeError("a worker crashed")  # Airflow retries the task
    clock.now += ADMITTED_LEASE_S - 60
    assert "a" in admitted(ledger)
    with pytest.raises(PermanentError), hold(ledger, j):  # the retry finds its admission ...
        raise PermanentError("max_hours reached")  # ... and fails for good
    assert ledger.entries() == []


def test_a_lapsed_admission_is_asked_for_again(ledger, clock):
    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    clock.now += 10_000  # the retry came much later: the admission ran out
    with hold(ledger, j):
        assert "a" in admitted(ledger)
    for name, team, slots in (("x", "vision", 6), ("y", "research", 2)):  # the fleet is full
        assert ledger.request(job(name, team, slots)).admitted
    with pytest.raises(NotAdmitted, match="not admitted any more"), hold(ledger, job("late", "nlp", 2)):
        pass


def test_a_job_keeps_its_place_when_it_missed_looks(ledger, clock):
    for name, team, slots in (("v", "vision", 4), ("n", "nlp", 2), ("r", "research", 2)):
        assert ledger.request(job(name, team, slots)).admitted
    assert not ledger.request(job("first", "vision", 4)).admitted
    clock.now += WAITING_LEASE_S + 1  # its admit task missed looks (a busy scheduler)
    for name in ("v", "n", "r"):
        ledger.renew(name)
    assert not ledger.request(job("second", "vision", 4)).admitted
    assert not ledger.request(job("first", "vision", 4)).admitted  # back, with its first arrival
    ledger.release("v")
    assert not ledger.request(job("second", "vision", 4)).admitted
    assert "first" in admitted(ledger)


def _worker(path: str, fleet: str, seed: int, jobs: int) -> list[str]:
    cfg = parse_resources(fleet)
    ledger = Ledger(path, cfg)
    rng = random.Random(seed)
    reach = {t: max_reach(cfg, t, "a100") for t in cfg.teams}
    violations = []
    for i in range(jobs):
        team = rng.choice(sorted(cfg.teams))
        j = Job(f"w{seed}-{i}", team, "a100", rng.randint(1, min(3, reach[team])), rng.randint(1, 9), 1.0)
        while not ledger.request(j).admitted:
            time.sleep(0.02)
        mine = ledger.claim_devices(j.id, j.slots, [str(d) for d in range(8)])
        live = [e for e in ledger.entries() if e.admitted is not None]
        given = [d for e in live for d in e.devices]
        if len(given) != len(set(given)) or len(mine) != j.slots:
            violations.append(f"devices shared: {[(e.job.id, e.devices) for e in live]}")
        total = sum(e.job.slots for e in live)
        per_team = {t: sum(e.job.slots for e in live if e.job.team == t) for t in cfg.teams}
        if total > 8 or any(per_team[t] > reach[t] for t in cfg.teams):
            violations.append(f"{total} slots, {per_team}")
        time.sleep(rng.random() * 0.01)
        ledger.release(j.id)
    return violations


def test_concurrent_processes_never_admit_past_capacity_or_quota(store):
    path = str(store("shared"))
    Ledger(path, parse_resources(FLEET))
    assert in_processes(_worker, [(path, FLEET, seed, 12) for seed in range(4)], timeout=600) == [[]] * 4


def _writes_elsewhere(path: str, fleet: str, rounds: int) -> None:
    """Another process's writes to a ledger, ``rounds`` times: a job queued (or admitted), renewed and
    released, and one queued that stays."""
    ledger = Ledger(path, parse_resources(fleet))
    for n in range(rounds):
        ledger.request(job(f"far-{n}", "nlp", 1))
        ledger.renew(f"far-{n}")
        ledger.release(f"far-{n}")
        time.sleep(0.05)
    ledger.request(job("far-last", "research", 1))


def test_a_decision_on_postgresql_decides_on_the_rows_a_full_read_gives_while_it_keeps_them(postgres, monkeypatch):
    """A decision on PostgreSQL keeps the rows it read and reads again only those whose xmin changed
    (Ledger._queue). In every decision, under every kind of write, this process's own, its own
    transaction's and another process's at the same time, the rows it decides on are those a full read in
    the same transaction gives. Kept rows of another server's history (a restart or a restore, which may
    hand out the same xids again) are never used."""
    import concurrent.futures

    from trainyard.scheduling.admission import ledger as ledgers

    url = postgres.database("ledger_kept")
    ledger = Ledger(url, parse_resources(FLEET))
    queue, looks = Ledger._queue, []

    def compared(self, conn):
        kept = queue(self, conn)
        assert sorted(kept, key=lambda e: e.job.id) == sorted(self._entries(conn), key=lambda e: e.job.id)
        looks.append(len(kept))
        return kept

    monkeypatch.setattr(Ledger, "_queue", compared)
    rng = random.Random(7)
    with concurrent.futures.ThreadPoolExecutor(1) as other:
        elsewhere = other.submit(in_processes, _writes_elsewhere, [(url, FLEET, 30)])
        for i in range(60):
            name = f"j{i % 12}"  # a name comes back: a row deleted and made again
            action = rng.choice(["request", "request", "release", "withdraw", "claim", "renew", "cancel"])
            if action == "request":
                ledger.request(job(name, rng.choice(["vision", "nlp", "research"]), rng.choice([1, 2, 3])))
            elif action == "claim" and any(e.job.id == name and e.admitted for e in ledger.entries()):
                slots = next(e.job.slots for e in ledger.entries() if e.job.id == name)
                ledger.claim_devices(name, slots, list("01234567"))
            elif action == "renew":
                ledger.renew(name)
            elif action == "cancel":
                ledger.cancel(name, "cancelled by a test")
            elif action in ("release", "withdraw"):
                getattr(ledger, action)(name)
        elsewhere.result()
    ledger.request(job("last", "vision", 1))
    assert len(looks) > 10 and "far-last" in {e.job.id for e in ledger.entries()}

    # rows kept from another history of the server (the same xmin, other content) are dropped, not used
    kept = ledgers._KEPT[ledger.db.url]
    (some, (xmin, entry)) = next(iter(kept.rows.items()))
    kept.rows[some] = (xmin, dataclasses.replace(entry, admitted=None if entry.admitted else 1.0))
    kept.server = ("an earlier start", *kept.server[1:])
    ledger.request(job("after-a-restart", "vision", 1))  # compared with a full read, as every look here


def test_a_change_made_by_hand_between_a_decisions_two_reads_is_seen_at_the_next_look_at_the_latest(postgres):
    """Between Ledger._queue's two reads only a hand-made change can come (every write of the ledger's takes
    the decisions' lock): a row deleted then, which the first read found changed, is left out and not kept;
    a row changed then, which the first read found unchanged, is decided on as it was, and read again at
    the next look."""
    from trainyard.scheduling.admission import ledger as ledgers

    url = postgres.database("ledger_by_hand")
    ledger = Ledger(url, parse_resources(FLEET))
    for name in ("deleted", "edited", "other"):
        ledger.request(job(name, "nlp", 3))  # three rows, admitted or waiting
    ledger.renew("deleted")  # written since this process's last look: the next look reads it again

    with ledger.db.transaction() as conn:

        class ByHandInBetween:
            def execute(self, sql: str, params: tuple = ()):
                done = conn.execute(sql, params)
                if sql.startswith("SELECT id, xmin"):
                    with ledger.db.connection() as other:
                        other.execute("DELETE FROM admission WHERE id = 'deleted'")
                        other.execute("UPDATE admission SET priority = 7 WHERE id = 'edited'")
                return done

        decided = {e.job.id: e for e in ledger._queue(ByHandInBetween())}
    assert "deleted" not in decided and "deleted" not in ledgers._KEPT[url].rows
    assert decided["edited"].job.priority == 1  # as the first read saw it
    with ledger.db.transaction() as conn:
        assert {e.job.id: e.job.priority for e in ledger._queue(conn)} == {"edited": 7, "other": 1}


def _a100s(count: int, **teams: str):
    """A fleet of one GPU type, ``count`` a100s at 1.0 an hour, and ``teams``: each team's name and the
    inside of its mapping in resources.yaml (``quota: {a100: 2}``)."""
    listed = "".join(f"  {name}: {{{body}}}\n" for name, body in teams.items())
    return parse_resources(f"gpu_types:\n  a100: {{count: {count}, price_per_hour: 1.0}}\nteams:\n{listed}")


def test_a_lending_limit_holds_while_others_borrow(store):
    cfg = _a100s(10, a="quota: {a100: 4}", b="quota: {a100: 3}", c="quota: {a100: 3}, lending_limit: {a100: 1}")
    ledger = Ledger(store("lend"), cfg)
    assert ledger.request(Job("b1", "b", "a100", 5, 1, 1.0)).admitted  # 2 borrowed: a's idle and c's 1
    refused = ledger.request(Job("a1", "a", "a100", 5, 1, 1.0))  # would borrow 1 more: only c's kept 2 are left
    assert not refused.admitted and "0 are lendable" in refused.message
    assert ledger.request(Job("c1", "c", "a100", 2, 1, 1.0)).admitted  # what c kept for itself is there


def test_a_lender_taking_its_quota_back_waits_rather_than_take_another_teams_reserve(store):
    """c lends nothing: its 2 slots are its own whatever happens. When a wants back the quota b borrowed,
    the free slots are c's, so a waits for b (nothing running is preempted), and c still gets its own."""
    cfg = _a100s(6, a="quota: {a100: 2}", b="quota: {a100: 2}", c="quota: {a100: 2}, lending_limit: {a100: 0}")
    ledger = Ledger(store("reserve"), cfg)
    assert ledger.request(Job("b1", "b", "a100", 4, 1, 1.0)).admitted  # borrows a's idle 2
    back = ledger.request(Job("a1", "a", "a100", 1, 1, 1.0))
    assert (
        not back.admitted and "team a's quota is lent out and the free slots are other teams' reserve" in back.message
    )
    assert ledger.request(Job("c1", "c", "a100", 2, 1, 1.0)).admitted  # c's reserve was kept for it
    ledger.release("b1")
    assert ledger.request(Job("a1", "a", "a100", 1, 1, 1.0)).admitted  # the borrower ended: a's quota is back


def test_a_fleet_already_lending_too_much_still_admits_what_makes_it_no_worse(store):
    """After the file lowers a lending limit, what is running may lend more than the new limits allow: a job
    that makes that no worse (one of a team that lends nothing) still starts."""
    reserved = "quota: {a100: 2}, lending_limit: {a100: 0}"
    ledger = Ledger(store("edit"), _a100s(6, a="quota: {a100: 2}", b="quota: {a100: 2}", r=reserved))
    assert ledger.request(Job("b1", "b", "a100", 4, 1, 1.0)).admitted  # borrows a's idle 2
    ledger.config = _a100s(6, a=reserved, b="quota: {a100: 2}", r=reserved)
    assert ledger.request(Job("r1", "r", "a100", 1, 1, 1.0)).admitted  # r's own reserve, no worse for anyone
    refused = ledger.request(Job("b2", "b", "a100", 1, 1, 1.0))
    assert not refused.admitted and "0 are lendable" in refused.message


def test_a_budget_stops_admission_of_jobs_it_cannot_cover(store):
    cfg = parse_resources(
        FLEET.replace(
            "vision: {quota: {a100: 4}, borrowing_limit: {a100: 2}}",
            "vision: {quota: {a100: 4}, borrowing_limit: {a100: 2}, monthly_budget: 10}",
        )
    )
    from trainyard.scheduling.budgets import Spend

    ledger = Ledger(store("budget"), cfg)
    spent = Spend({"vision": 4.0}, lambda run: 0.0)
    assert ledger.request(Job("v1", "vision", "a100", 2, 1, 2.0), spent).admitted  # 1.0 x 2 h x 2 = 4 of 6 left
    over = ledger.request(Job("v2", "vision", "a100", 2, 1, 1.5), spent)  # 3 more: only 2 left
    assert not over.admitted and "team vision's budget: 2.00 left, the job may cost 3.00" in over.message
    assert over.reason is WaitReason.BUDGET
    assert ledger.request(Job("v3", "vision", "a100", 1, 1, 2.0), spent).admitted  # 2 fits


def test_each_job_gets_devices_of_its_own_until_it_is_done(ledger, clock):
    from trainyard.errors import PermanentError

    host = ["0", "1", "2", "3", "MIG-5f8e"]
    a, b, c = job("a", "vision", 2), job("b", "nlp", 2), job("c", "research", 2)
    for j in (a, b, c):
        assert ledger.request(j).admitted
    assert ledger.claim_devices("a", 2, host) == ["0", "1"]
    assert ledger.claim_devices("b", 2, host) == ["2", "3"]
    assert ledger.claim_devices("a", 2, host) == ["0", "1"]  # a retry gets the same ones
    with pytest.raises(NoFreeDevices, match=r"1 free \(\['0', '1', '2', '3'\] held"):
        ledger.claim_devices("c", 2, host)
    ledger.release("a")
    assert ledger.claim_devices("c", 2, host) == ["0", "1"]
    clock.now += ADMITTED_LEASE_S + 1  # b's worker was killed: no heartbeat
    # c's heartbeat comes late, past its lease, but before any decision dropped its row: c trains on, and
    # keeps its devices
    assert ledger.renew("c")
    assert ledger.request(job("d", "vision", 4)).admitted  # this decision drops b's row
    with pytest.raises(NoFreeDevices, match=r"3 free \(\['0', '1'\] held"):
        ledger.claim_devices("d", 4, host)
    ledger.release("c")
    assert ledger.claim_devices("d", 4, host) == ["0", "1", "2", "3"]
    with pytest.raises(PermanentError, match="needs 6 device"):
        ledger.claim_devices("d", 6, host)
    with pytest.raises(NotAdmitted, match="not admitted"):
        ledger.claim_devices("nobody", 1, host)


def test_worker_hosts_sharing_a_ledger_each_hand_out_their_own_devices(store, clock):
    """Every host numbers its GPUs from 0: on a shared ledger a job on host b is not refused b's "0" because
    a job on host a holds a's "0", and a retry that lands on another host gets that host's devices."""
    config = parse_resources(FLEET)
    on_a = Ledger(store("hosts"), config, clock, host="gpu-a")
    on_b = Ledger(store("hosts"), config, clock, host="gpu-b")
    for name in ("x", "y"):
        assert on_a.request(job(name, "vision", 2)).admitted
    assert on_a.claim_devices("x", 2, ["0", "1"]) == ["0", "1"]
    assert on_b.claim_devices("y", 2, ["0", "1"]) == ["0", "1"]  # b's own 0 and 1
    with pytest.raises(NoFreeDevices):
        on_a.claim_devices("y", 2, ["0", "1"])  # y's retry on host a: a's are held by x
    on_a.release("x")
    assert on_a.claim_devices("y", 2, ["0", "1", "2"]) == ["0", "1"]  # claimed anew on a
    assert {e.job.id: (e.host, e.devices) for e in on_b.entries()}["y"] == ("gpu-a", ("0", "1"))


def test_a_job_s_workers_see_only_its_devices(monkeypatch):
    from trainyard.scheduling.hosts import host_inventory
    from trainyard.training.launchers.local import this_host

    monkeypatch.setenv("TRAINYARD_GPU_DEVICES", "0, 1,MIG-ab")
    assert host_inventory().devices_for("a100-80gb") == ["0", "1", "MIG-ab"]
    host = this_host(["1", "MIG-ab"])
    assert host.cuda_devices == 2 and host.env["CUDA_VISIBLE_DEVICES"] == "1,MIG-ab"


def test_the_final_try_of_a_failed_training_releases_at_once(ledger, clock):
    """No retry is left, so nothing is kept for one: the next job starts at its next look, not after
    ADMITTED_LEASE_S on an idle fleet."""
    for name, team, slots in (("a", "vision", 4), ("n", "nlp", 2), ("r", "research", 2)):
        assert ledger.request(job(name, team, slots)).admitted
    assert not ledger.request(job("next", "vision", 4)).admitted
    with pytest.raises(RuntimeError), hold(ledger, job("a", "vision", 4), final_try=True):
        raise RuntimeError("the custom command exited with 1")
    assert "a" not in {e.job.id for e in ledger.entries()}
    assert ledger.request(job("next", "vision", 4)).admitted


def test_a_retryable_error_is_not_permanent_whatever_its_class_says():
    """One definition of permanent: the error's ``retryable``, as the Airflow layer reads it."""
    from trainyard.errors import PermanentError, RetryableError, is_permanent

    assert is_permanent(PermanentError("x")) and not is_permanent(RetryableError("x"))
    assert not is_permanent(RuntimeError("x")) and not is_permanent(AdmissionLost("x"))


class PausedHeartbeat:
    """Holds job ``a``'s heartbeat (a paused VM, a renewal stuck behind a lock) until ``resume()``."""

    def __init__(self, ledger: Ledger, monkeypatch) -> None:
        import threading

        self.running, self.parked = threading.Event(), threading.Event()
        self.running.set()
        renew = ledger.renew

        def held_renew(job_id: str, *args):
            if job_id == "a" and threading.current_thread().name == "trainyard-admission-heartbeat":
                if not self.running.is_set():
                    self.parked.set()
                self.running.wait()
            return renew(job_id, *args)

        monkeypatch.setattr(ledger, "renew", held_renew)

    def pause(self) -> None:
        """Returns once the heartbeat waits at the gate (no beat is under way)."""
        self.parked.clear()
        self.running.clear()
        assert self.parked.wait(10)

    def resume(self) -> None:
        self.running.set()


def test_a_lapsed_lease_takes_its_own_row_back_while_the_slots_are_free(ledger, clock, monkeypatch):
    """The heartbeat missed its lease and a decision dropped the row: the training takes it back with its
    devices at its next beat, and no waiting job is handed them meanwhile."""
    heartbeat = PausedHeartbeat(ledger, monkeypatch)
    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    with hold(ledger, j, available=["0", "1", "2", "3", "4"], heartbeat_s=0.05) as lease:
        assert lease.devices == ["0", "1", "2", "3"]
        heartbeat.pause()
        clock.now += RUNNING_LEASE_S + 1
        assert ledger.request(job("small", "nlp", 2)).admitted  # this decision drops a's row
        assert "a" not in admitted(ledger)
        heartbeat.resume()
        deadline = time.monotonic() + 10
        while "a" not in admitted(ledger) and time.monotonic() < deadline:  # a's next beat takes it back
            time.sleep(0.02)
        assert not lease.lost.is_set()
        assert admitted(ledger) == {"a": 0, "small": 0}
        assert {e.job.id: e.devices for e in ledger.entries()}["a"] == ("0", "1", "2", "3")
        with pytest.raises(NoFreeDevices):
            ledger.claim_devices("small", 2, ["0", "1", "2", "3", "4"])  # only "4" is free


def test_a_lapsed_lease_whose_slots_went_elsewhere_stops_the_training(ledger, clock, monkeypatch):
    """When the slots were given to other jobs before the beat came back, the training must stop (never
    two jobs on one GPU): ``lost`` is set for the launcher, and the try ends in a retryable AdmissionLost."""
    heartbeat = PausedHeartbeat(ledger, monkeypatch)
    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    with (
        pytest.raises(AdmissionLost, match="its workers were stopped"),
        hold(ledger, j, heartbeat_s=0.05) as lease,
    ):
        heartbeat.pause()
        clock.now += RUNNING_LEASE_S + 1
        for name, team, slots in (("v", "vision", 2), ("n", "nlp", 2), ("r", "research", 2), ("l", "lab", 1)):
            assert ledger.request(job(name, team, slots)).admitted
        heartbeat.resume()
        assert lease.lost.wait(5)
        raise RuntimeError("the launcher stopped the workers")  # what run() does once lost is set
    assert "a" not in admitted(ledger)


def test_the_queue_needs_an_explicit_trainyard_home(monkeypatch):
    monkeypatch.delenv("TRAINYARD_HOME", raising=False)
    from trainyard.errors import PermanentError

    with pytest.raises(PermanentError, match="needs TRAINYARD_HOME set"):
        default_ledger()


def test_trainyard_queue_without_a_login_shows_jobs_only_as_team_gpus_and_priority(trainyard_home, capsys, monkeypatch):
    """Who waits and why is for the job's team and admins (a login, as Airflow says who it is: the executor
    test shows it); without one, every job is shown as how much of the fleet it asks for only."""
    import json

    from trainyard.cli import main

    for name in ("TOKEN", "USERNAME"):
        monkeypatch.delenv(f"AIRFLOW_API_{name}", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(trainyard_home / "no-config"))
    assert main(["queue"]) == 0
    assert "no job is waiting or admitted" in capsys.readouterr().out
    assert not (trainyard_home / LEDGER_FILE).exists()  # a look creates nothing
    ledger = default_ledger()
    assert ledger.request(Job("train_pipeline/first", "default", "cpu", 2, 5, 1.0, "alice")).admitted
    assert not ledger.request(Job("train_pipeline/second", "default", "cpu", 1, 7, 1.0, "bob")).admitted
    assert main(["queue", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"gpu_type": "cpu", "state": "admitted", "team": "default", "gpus": 2, "priority": 5},
        {"gpu_type": "cpu", "state": "waiting", "team": "default", "gpus": 1, "priority": 7},
    ]
    assert main(["queue"]) == 0
    table = capsys.readouterr().out
    assert "cpu:" in table and "bob" not in table and "train_pipeline/second" not in table
    assert "log in to Airflow (AIRFLOW_API_TOKEN) to see your team's in full" in table


def test_a_retried_job_commits_what_its_run_has_not_spent_yet(store):
    """One definition of a commitment for the ledger and the reports: a job's worst case less what its
    run's earlier tries cost. A retry near the end of the budget is admitted when what is left covers the
    rest of its worst case, as validate_spec and `report cost` count it."""
    from trainyard.scheduling.budgets import Spend

    cfg = parse_resources(FLEET.replace("nlp: {quota: {a100: 2}}", "nlp: {quota: {a100: 2}, monthly_budget: 10}"))
    ledger = Ledger(store("budget"), cfg)
    job = Job("retried", "nlp", "a100", 2, 1, 4.0)  # worst case 1.0 x 4 h x 2 = 8
    spent_by_run = {"retried": 5.0}  # its first try cost 5 (this month): 5 of 10 left, 3 more at worst
    spend = Spend({"nlp": 5.0}, lambda run: spent_by_run.get(run, 0.0))
    assert ledger.request(job, spend).admitted
    assert ledger.request(Job("other", "nlp", "a100", 1, 1, 1.0), spend).admitted  # 10 - 5 - 3 = 2 left
    third = ledger.request(Job("third", "nlp", "a100", 1, 1, 1.5), spend)
    assert not third.admitted and "team nlp's budget: 1.00 left, the job may cost 1.50" in third.message


def _token(claims: dict) -> str:
    import base64
    import json

    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"e30.{body}.c2ln"


def test_queue_cancel_refuses_who_is_not_of_the_team_and_what_is_not_queued(store):
    """Before Airflow is asked anything: a user outside the job's team (and not an admin) is refused, the
    job keeps its place; a run not in the queue and a token that is no JWT are named as such."""
    from trainyard.errors import CommandError, NotFoundError
    from trainyard.scheduling.cancel import cancel_run

    cfg = parse_resources(FLEET.replace("vision: {quota", "vision: {members: [alice], quota"))
    ledger = Ledger(store("q"), cfg)
    assert ledger.request(Job("train_pipeline/r1", "vision", "a100", 2, 1, 1.0, "alice")).admitted
    unreachable = "http://127.0.0.1:9"  # nothing listens: any call would fail differently
    with pytest.raises(CommandError, match="user 'bob' may not cancel run train_pipeline/r1: it is team 'vision'"):
        cancel_run(
            ledger, cfg, "train_pipeline", "r1", api_url=unreachable, token=_token({"sub": "bob", "role": "user"})
        )
    assert "train_pipeline/r1" in admitted(ledger)
    with pytest.raises(NotFoundError, match="is not in the queue"):
        cancel_run(ledger, cfg, "train_pipeline", "r2", api_url=unreachable, token=_token({"sub": "alice"}))
    with pytest.raises(CommandError, match="not a JWT"):
        cancel_run(ledger, cfg, "train_pipeline", "r1", api_url=unreachable, token="nonsense")
    with pytest.raises(CommandError, match="could not reach Airflow's API"):  # alice may: Airflow is asked
        cancel_run(ledger, cfg, "train_pipeline", "r1", api_url=unreachable, token=_token({"sub": "alice"}))
    assert "train_pipeline/r1" in admitted(ledger)  # nothing is released before Airflow ended the run


def test_a_cancelled_job_is_not_brought_back_by_its_own_tasks(ledger, clock):
    """Its trigger's next look and its training's heartbeat were already under way when the user
    cancelled: neither queues it again, and a training of it stops."""
    assert ledger.request(job("a", "vision", 4)).admitted
    assert not ledger.request(job("w", "vision", 6)).admitted
    ledger.cancel("w", "cancelled by alice (trainyard queue cancel)")
    again = ledger.request(job("w", "vision", 6))
    assert again.standing is Standing.CANCELLED and not again.admitted and "by alice" in again.message
    assert "w" not in {e.job.id for e in ledger.entries()}
    ledger.cancel("a", "cancelled by alice (trainyard queue cancel)")
    assert not ledger.renew("a") and not ledger.reclaim(job("a", "vision", 4))
    assert ledger.entries() == []
    from trainyard.errors import PermanentError

    with pytest.raises(PermanentError, match="cancelled by alice"), hold(ledger, job("a", "vision", 4)):
        pass  # a retry of its training fails for good instead of waiting to be admitted again


def test_a_training_cancelled_while_it_runs_stops_for_good(ledger, clock):
    """Its next heartbeat finds the job cancelled: the workers are told to stop, and the try fails
    permanently, saying who cancelled (not as a lost lease a retry would wait out)."""
    from trainyard.errors import PermanentError

    j = job("a", "vision", 4)
    assert ledger.request(j).admitted
    with pytest.raises(PermanentError, match="cancelled by alice"), hold(ledger, j, heartbeat_s=0.05) as lease:
        ledger.cancel("a", "cancelled by alice (trainyard queue cancel)")
        assert lease.lost.wait(5)
        raise RuntimeError("the launcher stopped the workers")
    assert ledger.entries() == [] and ledger.cancelled("a")


def test_a_sweep_never_holds_more_trials_than_its_parallelism(ledger):
    """Trials of one sweep run (one group) past its parallelism wait, naming it, and hold nothing back:
    another job, and another sweep, start in the slots left."""

    def trial(name: str, group: str = "sweep-a") -> Job:
        return Job(name, "vision", "a100", 1, 1, 1.0, "", group, 2)

    assert ledger.request(trial("a/slot-0")).admitted
    assert ledger.request(trial("a/slot-1")).admitted
    third = ledger.request(trial("a/slot-2"))
    assert not third.admitted and "sweep sweep-a has 2 trial(s) running, its parallelism" in third.message
    assert third.reason is WaitReason.SWEEP_PARALLELISM
    assert ledger.request(job("v1", "vision", 1)).admitted  # the quota had room: another job takes it
    assert ledger.request(trial("b/slot-0", "sweep-b")).admitted
    ledger.release("a/slot-0")
    assert ledger.request(trial("a/slot-2")).admitted  # one trial done: the next one starts
    assert sorted(e.job.id for e in ledger.entries() if e.job.group == "sweep-a" and e.admitted) == [
        "a/slot-1",
        "a/slot-2",
    ]


def test_a_ledger_from_before_sweeps_gains_their_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the table as it was before devices, users and sweeps
        conn.execute(
            "CREATE TABLE admission (id TEXT PRIMARY KEY, team TEXT NOT NULL, gpu_type TEXT NOT NULL, "
            "slots INTEGER NOT NULL, priority INTEGER NOT NULL, max_hours REAL NOT NULL, enqueued REAL NOT NULL, "
            "admitted REAL, borrowed INTEGER NOT NULL DEFAULT 0, lease_until REAL NOT NULL)"
        )
    old = Ledger(path, parse_resources(FLEET))
    assert old.request(Job("s/slot-0", "vision", "a100", 1, 1, 1.0, "ann", "s", 1)).admitted
    assert not old.request(Job("s/slot-1", "vision", "a100", 1, 1, 1.0, "ann", "s", 1)).admitted
    assert {e.job.group for e in old.entries()} == {"s"}


# -- preemption: a lender takes its quota back; the borrower checkpoints, stops and waits in its place ----
def _lender_waits_for_a_borrower(ledger: Ledger, clock) -> Job:
    """vision borrows nlp's idle quota (v2), research fills the fleet, then nlp wants its quota back."""
    for j in (job("v1", "vision", 4), job("v2", "vision", 2), job("r1", "research", 1), job("r2", "research", 1)):
        assert ledger.request(j).admitted
    n1 = job("n1", "nlp", 2)
    early = ledger.request(n1)
    assert early.reason is WaitReason.SLOTS_IN_USE  # v2 has run less than min_runtime_minutes (10)
    assert ledger.preempted_for("v2") is None
    for looks in (True, True, True, True, False):  # 10 min and more, their heartbeats renewing them
        clock.now += 121
        for running in ("v1", "v2", "r1", "r2"):
            assert ledger.renew(running)
        if looks:  # n1 keeps its place; before the 10 min nothing is preempted for it
            assert ledger.request(n1).reason is WaitReason.SLOTS_IN_USE
    assert ledger.preempted_for("v2") is None
    return n1


def test_a_lender_takes_its_quota_back_and_the_borrower_waits_again_in_its_place(ledger, clock):
    n1 = _lender_waits_for_a_borrower(ledger, clock)
    arrived = next(e.enqueued for e in ledger.entries() if e.job.id == "v2")
    said = ledger.request(n1)
    assert said.reason is WaitReason.PREEMPTING
    assert "reclaiming 2 a100 slot(s) of team nlp's quota from team vision's job" in said.message
    assert ledger.preempted_for("v2") == "n1"
    # until the borrower's workers have ended its slots stay taken: a second look admits nothing
    assert ledger.request(n1).reason is WaitReason.PREEMPTING
    assert admitted(ledger) == {"v1": 0, "v2": 2, "r1": 0, "r2": 0}
    shown = {e.job.id: v for e, v in ledger.standing()}
    assert shown["v2"].standing is Standing.PREEMPTED
    assert shown["v2"].message.startswith("preempted for team nlp's job of 2 a100 slot(s) within its quota")
    (held,) = [e for e in ledger.entries() if e.job.id == "v2"]
    ledger.requeue("v2")  # its training stopped at a checkpoint
    # its stint on the slots is kept (Airflow's record of its rescheduled task will show the next one only)
    assert ledger.stints(0, clock.now) == [Stint("v2", "vision", "a100", 2, held.admitted, clock.now)]
    assert ledger.stints(clock.now + 1, clock.now + 2) == []  # outside the window
    assert ledger.request(n1).admitted
    again = ledger.request(job("v2", "vision", 2))
    assert not again.admitted
    (v2,) = [e for e in ledger.entries() if e.job.id == "v2"]
    assert (v2.admitted, v2.preemptions, v2.preempted_for, v2.enqueued) == (None, 1, "", arrived)
    # its waiting row runs out (nobody looked for 2 min) and is made anew: the count and the clock stay
    clock.now += WAITING_LEASE_S + 1
    assert not ledger.request(job("v2", "vision", 2)).admitted
    (again,) = [e for e in ledger.entries() if e.job.id == "v2"]
    assert (again.preemptions, again.waiting_since, again.enqueued) == (1, v2.waiting_since, arrived)


def test_a_training_hears_its_preemption_through_its_lease_and_its_slots_go_to_the_lender(ledger, clock):
    n1 = _lender_waits_for_a_borrower(ledger, clock)
    v2 = job("v2", "vision", 2)
    with pytest.raises(Preempted), hold(ledger, v2, heartbeat_s=0.05) as lease:
        assert not lease.preempted.is_set()
        assert ledger.request(n1).reason is WaitReason.PREEMPTING
        assert lease.preempted.wait(10), "the lease never heard the word"
        raise Preempted("its workers stopped at step 7 with a checkpoint there", step=7)  # as the launcher ends
    assert ledger.request(n1).admitted
    assert "v2" not in admitted(ledger) and ledger.request(v2).reason is not None  # waiting again


def test_preemption_off_in_resources_yaml_leaves_borrowers_running(store, clock):
    fleet = FLEET.replace("  max_wait_minutes: 10\n", "  max_wait_minutes: 10\n  preemption: {enabled: false}\n")
    ledger = Ledger(store("no_preemption"), parse_resources(fleet), clock)
    n1 = _lender_waits_for_a_borrower(ledger, clock)
    assert ledger.request(n1).reason is WaitReason.SLOTS_IN_USE
    assert ledger.preempted_for("v2") is None


def test_a_borrower_preempted_after_the_wait_bound_does_not_take_the_slots_back_from_the_lender(ledger, clock):
    """v2 arrived 10 min and more ago: past scheduling.max_wait_minutes by its arrival. Requeued, its wait
    bound counts from its return to the queue (it has run), so the lender, arrived just now, goes first."""
    for j in (job("v1", "vision", 4), job("v2", "vision", 2), job("r1", "research", 1), job("r2", "research", 1)):
        assert ledger.request(j).admitted
    for _ in range(5):
        clock.now += 121
        for running in ("v1", "v2", "r1", "r2"):
            assert ledger.renew(running)
    n1 = job("n1", "nlp", 2)
    assert ledger.request(n1).reason is WaitReason.PREEMPTING
    ledger.requeue("v2")
    assert not ledger.request(job("v2", "vision", 2)).admitted  # its look admits the lender, not itself
    assert admitted(ledger) == {"v1": 0, "n1": 0, "r1": 0, "r2": 0}


def test_a_mig_type_admits_as_many_jobs_as_each_profile_has_slices(store, clock):
    """Two A100s cut into 3 x 1g.10gb + 2 x 2g.20gb each: six 1g jobs at once and four 2g jobs beside
    them, each profile counted apart (a JobSpec's resources.mig_profile), not two jobs for two GPUs; the
    seventh 1g job waits for a 1g slice."""
    from trainyard.scheduling.admission.ledger import job_for
    from trainyard.spec import Resources

    fleet = parse_resources(
        "gpu_types:\n  a100-mig: {count: 2, price_per_hour: 1.4, mig_profiles: {1g.10gb: 3, 2g.20gb: 2}}\n"
        "teams:\n  vision: {quota: {a100-mig: 2}}\n"
    )
    ledger = Ledger(store("mig"), fleet, clock)

    def sliced(n: int, profile: str):
        res = Resources(gpu_type="a100-mig", mig_profile=profile, gpus_per_node=1, team="vision", max_hours=1.0)
        return job_for(res, f"{profile}-{n}")

    assert all(ledger.request(sliced(n, "1g.10gb")).admitted for n in range(6))
    seventh = ledger.request(sliced(6, "1g.10gb"))
    assert seventh.reason is WaitReason.SLOTS_IN_USE and "a100-mig.1g.10gb: 6 of 6 slots in use" in seventh.message
    assert all(ledger.request(sliced(n, "2g.20gb")).admitted for n in range(4))
    assert ledger.request(sliced(4, "2g.20gb")).reason is WaitReason.SLOTS_IN_USE
    ledger.release("1g.10gb-0")
    assert ledger.request(sliced(6, "1g.10gb")).admitted


def test_another_node_of_a_multi_node_job_follows_node_0_s_admission_and_hears_its_word_and_its_cancel(
    ledger, monkeypatch
):
    """Node 1 neither asks for nor renews the admission (node 0's hold does): it trains while the job is
    admitted, sets its lease's word when the job is preempted and its stop when the job is cancelled."""
    from trainyard.errors import PermanentError
    from trainyard.scheduling.admission import lease as leases

    monkeypatch.setattr(leases, "WORD_POLL_S", 0.05)
    pair = dataclasses.replace(job("pair", "vision", 2), nodes=2)
    with pytest.raises(leases.JobGone, match="neither admitted nor waiting"), leases.follow(ledger, pair, 1):
        pass
    assert ledger.entries() == []  # it asked for nothing
    assert ledger.request(pair).admitted
    with leases.follow(ledger, pair, 1) as lease:
        assert lease.devices is None and not lease.preempted.is_set()
        assert ledger.node_devices("pair") == {1: (ledger.host, ())}  # it joined, on this host
        with ledger.db.transaction() as conn:  # as a decision marks the job it preempts
            conn.execute("UPDATE admission SET preempted_for = 'n1' WHERE id = 'pair'")
        assert lease.preempted.wait(5), "node 1 never heard the word"
    assert ledger.node_devices("pair") == {} and ledger.admitted("pair")  # it left; it released nothing
    ledger.requeue("pair")  # node 0 gave the slots back: the job waits, and so does this node
    with pytest.raises(NotAdmitted, match="waits for node 0's admission"), leases.follow(ledger, pair, 1):
        pass
    assert ledger.request(pair).admitted
    with pytest.raises(PermanentError, match="cancelled by alice"), leases.follow(ledger, pair, 1) as lease:
        ledger.cancel("pair", "cancelled by alice (trainyard queue cancel)")
        assert lease.lost.wait(5)
