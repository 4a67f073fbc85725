"""The ledger's PostgreSQL store where it differs from the SQLite file: leases judged by the database
server's clock, a server that restarts (the ledger says it cannot be reached, nothing is decided, and the
next look finds every row where it was), a training's heartbeat that rides out the restart, and a URL's
password kept out of every message. The rules themselves are tested on both stores in test_admission.py."""

import threading
import time

import psycopg2
import pytest

from trainyard.scheduling.admission.lease import hold
from trainyard.scheduling.admission.ledger import RUNNING_LEASE_S, Ledger
from trainyard.scheduling.admission.policy import Job
from trainyard.scheduling.ledger_db import DatabaseUnavailable, open_db
from trainyard.scheduling.resources import parse_resources

FLEET = parse_resources("gpu_types: {a100: {count: 2, price_per_hour: 1.0}}\nteams: {vision: {quota: {a100: 2}}}\n")


def _job(name: str, slots: int = 1) -> Job:
    return Job(name, "vision", "a100", slots, 1, 1.0)


def test_leases_are_judged_by_the_database_server_s_clock(postgres, monkeypatch):
    """A host whose clock is an hour ahead neither lengthens the leases it writes nor ends others' early."""
    url = postgres.database("ledger_clock")
    Ledger(url, FLEET).request(_job("a"))
    real = time.time()
    monkeypatch.setattr(time, "time", lambda: real + 3600)  # this host's clock, skewed
    skewed = Ledger(url, FLEET)
    assert not skewed.request(_job("b", 2)).admitted  # a's slot is still held: its lease has not run out
    (a,) = [e for e in skewed.entries() if e.job.id == "a"]
    assert abs(a.lease_until - (real + 600)) < 30  # the admitted lease, from the server's clock


def test_a_restarting_server_decides_nothing_and_the_ledger_is_found_whole(postgres_of_its_own):
    url = postgres_of_its_own.database("ledger_restart")
    ledger = Ledger(url, FLEET)
    assert ledger.request(_job("a")).admitted
    postgres_of_its_own.server.stop_server()
    with pytest.raises(
        DatabaseUnavailable, match=r"shared database at postgresql://postgres@127\.0\.0\.1:\d+/ledger_restart"
    ):
        ledger.request(_job("b"))
    postgres_of_its_own.server.start_server()
    assert [e.job.id for e in ledger.entries()] == ["a"]
    assert ledger.request(_job("b")).admitted  # b's look during the outage left nothing behind


def test_a_training_s_heartbeat_rides_out_a_restart(postgres_of_its_own):
    """The server goes down for a few beats while a job trains: the beats that fail are logged, the next
    one renews the lease; the training is not stopped and its slots are released at its end."""
    ledger = Ledger(postgres_of_its_own.database("ledger_beat"), FLEET)
    job = _job("trains", 2)
    assert ledger.request(job).admitted
    with hold(ledger, job, heartbeat_s=0.1) as lease:
        postgres_of_its_own.server.stop_server()
        time.sleep(0.5)  # beats fail meanwhile
        postgres_of_its_own.server.start_server()
        restarted = time.time()
        renewed = threading.Event()
        deadline = restarted + 20
        while time.time() < deadline and not renewed.is_set():
            (entry,) = ledger.entries()
            # a lease renewed before the stop ends before restarted + RUNNING_LEASE_S - 0.5 (the outage)
            if entry.lease_until > restarted + RUNNING_LEASE_S - 0.4:
                renewed.set()
            time.sleep(0.1)
        assert renewed.is_set() and not lease.lost.is_set()
    assert ledger.entries() == []


def test_concurrent_first_opens_make_the_tables_once(postgres):
    """Every process opens the ledger when it starts: many at once on an empty database all succeed."""
    url = postgres.database("ledger_first_open")
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            open_db(url)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ledger_lock")
        assert cur.fetchone()[0] == 1


def test_a_password_in_the_url_stays_out_of_the_messages():
    with pytest.raises(DatabaseUnavailable) as err:
        open_db("postgresql://ledger@127.0.0.1:9/trainyard?password=hunter2")
    assert "hunter2" not in str(err.value) and "postgresql://ledger@127.0.0.1:9/trainyard" in str(err.value)
    with pytest.raises(DatabaseUnavailable) as err:
        open_db("postgresql+psycopg2://ledger:hunter2@127.0.0.1:9/trainyard")
    assert "hunter2" not in str(err.value) and "postgresql://ledger:***@127.0.0.1:9/trainyard" in str(err.value)
