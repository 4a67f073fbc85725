"""When a waiting job starts (``trainyard.scheduling.admission.starts``): the expected start and its band from
how long recent jobs held their slots, the bound from their max_hours; the history the ledger keeps for it
on both of its stores."""

from __future__ import annotations

import time

import pytest

from trainyard.scheduling.admission.ledger import Ledger
from trainyard.scheduling.admission.policy import Entry, Job
from trainyard.scheduling.admission.starts import (
    BAND,
    HISTORY_KEPT_S,
    NO_HISTORY,
    WAIT_FLOOR_S,
    WAITING_IN_SIGHT,
    History,
    StartEstimate,
    estimate_starts,
    start_in_words,
    wait_ratio,
)
from trainyard.scheduling.resources import parse_resources

FLEET = parse_resources(
    "gpu_types:\n  a100: {count: 8, price_per_hour: 2.0}\n"
    "teams:\n  vision: {quota: {a100: 4}}\n  nlp: {quota: {a100: 4}}\n"
)
NOW = 1_000_000.0
HOUR = 3600.0


def _job(job_id: str, team: str, slots: int, max_hours: float = 10.0) -> Job:
    return Job(job_id, team, "a100", slots, 1, max_hours)


def test_a_job_holds_its_slots_as_long_as_its_teams_recent_jobs_held_theirs_given_how_long_it_has_run():
    history = History({"vision": [0.1, 0.2, 0.3, 0.4, 0.5], "nlp": [0.9, 0.9]})
    job = _job("vision/a", "vision", 1)
    assert history.hold_s(job, 0.0, 0.5) == pytest.approx(0.3 * 10 * HOUR)  # the median share of 10 h
    assert history.hold_s(job, 0.0, 0.0) == pytest.approx(0.1 * 10 * HOUR)
    # having run 3.5 h, it is one of those that ran longer: 0.4 and 0.5, their median 0.45
    assert history.hold_s(job, 3.5 * HOUR, 0.5) == pytest.approx(0.45 * 10 * HOUR)
    assert history.hold_s(job, 6 * HOUR, 0.5) == 10 * HOUR  # longer than any: its max_hours
    assert history.hold_s(job, 11 * HOUR, 0.5) == 11 * HOUR  # past its max_hours: it ends now
    # nlp has too little history of its own: the fleet's (all seven) is used
    assert history.known("nlp") and history.hold_s(_job("nlp/a", "nlp", 1), 0.0, 0.5) == pytest.approx(0.4 * 10 * HOUR)
    assert not NO_HISTORY.known("vision") and NO_HISTORY.hold_s(job, 0.0, 0.5) == 10 * HOUR


def test_the_expected_start_follows_the_history_its_band_the_record_of_waits_and_the_bound_the_max_hours():
    running = [Entry(_job("nlp/run", "nlp", 8), NOW - 2 * HOUR, NOW - HOUR, 4, NOW + 180)]
    waiting = [Entry(_job("vision/wait", "vision", 4), NOW - 60, None, 0, NOW + 120)]
    # the bound alone without history: nlp/run ends by its 10 h, 9 h from now
    assert estimate_starts(FLEET, running + waiting, NOW) == {"vision/wait": StartEstimate(NOW + 9 * HOUR)}
    # nlp's jobs held their slots for 30 % to 50 % of their max_hours: it ends in about 3 h (the median)
    history = History({"nlp": [0.3, 0.35, 0.4, 0.45, 0.5]})
    (est,) = estimate_starts(FLEET, running + waiting, NOW, history=history).values()
    assert (est.latest, est.early, est.late) == (NOW + 9 * HOUR, None, None)  # no record of waits: no band
    assert est.expected == pytest.approx(NOW + 3 * HOUR)
    assert start_in_words(est, NOW).startswith("expected to start about 1970-01-12 ")
    # the last waits came out between half and twice what they were told (with a look's floor)
    ratios = [0.5 + 1.5 * i / 99 for i in range(100)]
    (est,) = estimate_starts(FLEET, running + waiting, NOW, history=History(history.shares, ratios)).values()
    told = 3 * HOUR + WAIT_FLOOR_S
    # split conformal ranks of 100 ratios: the floor(101 x 5 %) = 5th and the ceil(101 x 95 %) = 96th
    assert BAND == (0.05, 0.95)
    assert est.early == pytest.approx(NOW + told * ratios[4] - WAIT_FLOOR_S)
    assert est.late == pytest.approx(NOW + told * ratios[95] - WAIT_FLOOR_S)
    words = start_in_words(est, NOW)
    assert "(about 9 in 10 start between " in words and words.endswith("and no later job passes it")
    assert wait_ratio(3 * HOUR, 6 * HOUR) == pytest.approx((6 * HOUR + WAIT_FLOOR_S) / told)


def test_a_job_being_preempted_for_is_expected_once_its_victims_have_stopped():
    victim = Entry(_job("nlp/borrows", "nlp", 8), NOW - 2 * HOUR, NOW - HOUR, 4, NOW + 180, preempted_for="vision/l")
    lender = Entry(_job("vision/l", "vision", 4), NOW - 60, None, 0, NOW + 120)
    history = History({"nlp": [0.9] * 5})  # nlp's jobs run long: not what frees the slots here
    (est,) = estimate_starts(FLEET, [victim, lender], NOW, history=history).values()
    assert est.latest == est.expected == NOW + FLEET.scheduling.preemption.grace_seconds
    assert start_in_words(est, NOW) == "starts at its next look"


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "ledger.db"
    return request.getfixturevalue("postgres").database("ledger_holds")


def test_the_ledger_keeps_how_long_finished_jobs_held_their_slots_for_a_month(where):
    now = [NOW]
    ledger = Ledger(where, FLEET, lambda: now[0])
    for i, hours in enumerate([1.0, 2.0, 5.0]):
        assert ledger.request(_job(f"vision/{i}", "vision", 1)).admitted
        now[0] += hours * HOUR
        ledger.release(f"vision/{i}")
    ledger.request(_job("nlp/never", "nlp", 9))  # more than the type has: it waits, and gives up
    ledger.release("nlp/never")
    assert ledger.history().shares == {"vision": [0.1, 0.2, 0.5], "": [0.1, 0.2, 0.5]}
    now[0] += HISTORY_KEPT_S - 2 * HOUR  # the first two are past the month: a decision drops them
    ledger.request(_job("nlp/later", "nlp", 1))
    with ledger.db.connection() as conn:
        assert conn.execute("SELECT id FROM holds").fetchall() == [("vision/2",)]
    assert ledger.history().shares == {"vision": [0.5], "": [0.5]}
    ledger.release("nlp/later")
    # a job told it waits 30 s (and told again later: the first is kept), admitted 90 s on: its ratio is kept
    assert ledger.request(_job("vision/all", "vision", 8)).admitted
    assert not ledger.request(_job("nlp/w", "nlp", 4)).admitted
    ledger.record_told_wait("nlp/w", now[0], 30.0)
    now[0] += 90
    ledger.record_told_wait("nlp/w", now[0], 5 * HOUR)
    ledger.release("vision/all")
    assert ledger.request(_job("nlp/w", "nlp", 4)).admitted
    assert ledger.history().ratios == [pytest.approx((90 + WAIT_FLOOR_S) / (30 + WAIT_FLOOR_S))]


def test_a_waiting_job_is_told_its_expected_start_once_the_ledger_has_history(trainyard_home):
    from trainyard.scheduling.admission.ledger import place_in_queue, verdict_in_words

    now = [NOW]
    ledger = Ledger(trainyard_home / "ledger.db", FLEET, lambda: now[0])
    for i in range(5):  # nlp's jobs held their slots for 2 of their 10 hours
        assert ledger.request(_job(f"nlp/done{i}", "nlp", 8)).admitted
        now[0] += 2 * HOUR
        ledger.release(f"nlp/done{i}")
    # each team in its own quota (nothing to preempt): vision's jobs are judged by the fleet's history
    assert (
        ledger.request(_job("nlp/run", "nlp", 4)).admitted and ledger.request(_job("vision/run", "vision", 4)).admitted
    )
    now[0] += HOUR
    assert ledger.renew("nlp/run") and ledger.renew("vision/run")
    assert not ledger.request(_job("vision/wait", "vision", 4)).admitted
    verdict = ledger.request(_job("vision/wait", "vision", 4))
    said = verdict_in_words(ledger, "vision/wait", verdict)  # the admit task's log line: the job is told
    with ledger.db.connection() as conn:
        told = conn.execute("SELECT told_at, told_wait FROM admission WHERE id = 'vision/wait'").fetchone()
    assert told == (now[0], pytest.approx(HOUR))
    assert place_in_queue(ledger, "vision/wait") in said  # what trainyard queue and submit --wait say
    # the two running, an hour in, are expected to end an hour from now, and by their max_hours 9 h from now
    expected, bound = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now[0] + h * HOUR)) for h in (1, 9))
    assert f"expected to start about {expected}" in said and said.endswith(
        f"starts by {bound} if the running jobs end by their max_hours and no later job passes it"
    )


def test_the_band_is_drawn_at_split_conformal_ranks():
    # 39 ratios 1..39: (n + 1) x 5 % = 2, the 2nd; (n + 1) x 95 % = 38, the 38th
    history = History({}, [float(r) for r in range(1, 40)])
    assert history.band(0.0, floor_s=1.0) == (1.0, 37.0)  # 1 x 2 - 1 and 1 x 38 - 1
    assert History({}, [1.0] * 19).band(100.0) is None  # fewer than MIN_TOLD


def test_a_long_queue_keeps_jobs_that_fit_now_in_sight_and_leaves_out_teams_no_longer_in_the_file():
    """Beyond the first WAITING_IN_SIGHT of a type a job that the policy admits now (a backfill) is still
    placed, and a row of a team taken out of resources.yaml is not looked at (nor does it break the rest)."""
    running = [
        Entry(_job("nlp/run", "nlp", 4), NOW - 2 * HOUR, NOW - HOUR, 0, NOW + 180),
        Entry(_job("gone/run", "removed", 2), NOW - 2 * HOUR, NOW - HOUR, 0, NOW + 180),
    ]
    big = [
        Entry(_job(f"vision/big{i:03d}", "vision", 8), NOW - 500 + i, None, 0, NOW + 120)
        for i in range(WAITING_IN_SIGHT)
    ]
    small = Entry(_job("nlp/small", "nlp", 2, max_hours=24.0), NOW - 10, None, 0, NOW + 120)
    found = estimate_starts(FLEET, running + big + [small], NOW)
    assert found["nlp/small"].latest == NOW  # it fits beside nlp/run now, though 100 jobs are before it
    assert found["vision/big000"].latest == NOW + 24 * HOUR  # once nlp/run and nlp/small have ended
    assert "gone/run" not in found and not any(e.behind for e in found.values())
    late = Entry(_job("vision/late", "vision", 8), NOW, None, 0, NOW + 120)
    assert estimate_starts(FLEET, running + big + [late], NOW)["vision/late"] == StartEstimate(None, behind=True)
    assert start_in_words(StartEstimate(None, behind=True), NOW).startswith(f"more than {WAITING_IN_SIGHT} jobs")


def test_a_ledger_of_the_version_before_gains_the_estimates_tables_and_columns(where):
    from trainyard.scheduling.ledger_db import SCHEMA

    Ledger(where, FLEET)
    made = Ledger(where, FLEET)
    with made.db.connection() as conn:  # back to the version before: no history, no told wait, no indexes
        for statement in SCHEMA:
            if statement.startswith("CREATE INDEX"):
                conn.execute("DROP INDEX " + statement.split()[5])
        for table in ("holds", "wait_ratios", "job_nodes", "stints"):  # the last two: versions after
            conn.execute(f"DROP TABLE {table}")
        for column in ("told_at", "told_wait", "nodes"):
            conn.execute(f"ALTER TABLE admission DROP COLUMN {column}")
    now = [NOW]
    again = Ledger(where, FLEET, lambda: now[0])
    assert again.request(_job("vision/all", "vision", 8)).admitted
    assert not again.request(_job("nlp/w", "nlp", 4)).admitted
    again.record_told_wait("nlp/w", now[0], 0.0)
    now[0] += 60
    again.release("vision/all")
    assert again.request(_job("nlp/w", "nlp", 4)).admitted
    history = again.history()
    assert history.shares["vision"] == [pytest.approx(60 / (10 * HOUR))] and history.ratios == [2.0]


def test_a_report_reads_the_ledger_read_only_and_leaves_an_earlier_versions_schema_to_the_next_admission(where):
    import re

    from trainyard.scheduling.ledger_db import LedgerOutdated

    writer = Ledger(where, FLEET)
    assert writer.request(_job("vision/a", "vision", 2)).admitted
    reader = Ledger(where, FLEET, read_only=True)  # as trainyard queue and the pages open it
    assert [e.job.id for e in reader.entries()] == ["vision/a"]
    assert [verdict.admitted for _, verdict in reader.standing()] == [True]
    with pytest.raises(Exception, match=re.compile("read-?only", re.IGNORECASE)):
        reader.request(_job("nlp/b", "nlp", 1))
    assert [e.job.id for e in writer.entries()] == ["vision/a"]

    with writer.db.connection() as conn:  # an earlier version's ledger: no told wait, no nodes
        conn.execute("DROP TABLE job_nodes")
        for column in ("told_wait", "nodes"):
            conn.execute(f"ALTER TABLE admission DROP COLUMN {column}")

    def columns() -> set[str]:
        with writer.db.connection() as conn:
            if isinstance(where, str):
                rows = conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'admission'"
                ).fetchall()
                return {r[0] for r in rows}
            return {r[1] for r in conn.execute("PRAGMA table_info(admission)").fetchall()}

    with pytest.raises(LedgerOutdated, match="next job's admission"):
        Ledger(where, FLEET, read_only=True)
    assert not {"told_wait", "nodes"} & columns()  # the report altered nothing
    Ledger(where, FLEET)  # an admission's open brings it up to date
    assert {"told_wait", "nodes"} <= columns()
    assert [e.job.id for e in Ledger(where, FLEET, read_only=True).entries()] == ["vision/a"]


def test_a_new_cluster_s_empty_database_is_an_empty_queue_to_a_report_and_a_job_s_first_task_makes_the_ledger(
    postgres, trainyard_home, monkeypatch
):
    from trainyard.pipeline import validate_spec
    from trainyard.scheduling.admission.ledger import existing_ledger

    monkeypatch.setenv("TRAINYARD_DATABASE_URL", postgres.database("ledger_new_cluster"))
    assert existing_ledger(FLEET) is None  # trainyard queue and the pages: nothing was ever queued
    validate_spec({"resources": {"team": "default", "gpu_type": "cpu"}})  # the run's first task, a writer
    ledger = existing_ledger(FLEET)
    assert ledger is not None and ledger.entries() == []


def test_a_job_s_first_task_brings_an_earlier_versions_ledger_up_to_date_where_a_report_is_refused(trainyard_home):
    from trainyard import paths
    from trainyard.pipeline import validate_spec
    from trainyard.scheduling.admission.ledger import LEDGER_FILE, existing_ledger
    from trainyard.scheduling.ledger_db import LedgerOutdated
    from trainyard.submit import local_queue_place

    made = Ledger(paths.home() / LEDGER_FILE, FLEET)
    assert not made.request(_job("vision/big", "vision", 9)).admitted  # more than the fleet: it waits
    with made.db.connection() as conn:  # an earlier version's: no told wait, no nodes
        conn.execute("DROP TABLE job_nodes")
        for column in ("told_wait", "nodes"):
            conn.execute(f"ALTER TABLE admission DROP COLUMN {column}")
    with pytest.raises(LedgerOutdated):
        existing_ledger(FLEET)
    assert local_queue_place("vision/big").startswith("its place unknown: the admission ledger")  # submit --wait
    validate_spec({"resources": {"team": "default", "gpu_type": "cpu"}})
    assert [e.job.id for e in existing_ledger(FLEET).entries()] == ["vision/big"]
