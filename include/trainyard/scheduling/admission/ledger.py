"""The admission ledger: the entries of the queue in their store (a SQLite file of this host, or a PostgreSQL
database every host reaches), each decision of the policy (:mod:`.policy`) applied in one transaction, and
what a job's tasks ask of it (request, renew, reclaim, release, cancel, devices)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError
from trainyard.scheduling.admission.policy import (
    Entry,
    Job,
    PreemptionRules,
    Standing,
    Verdict,
    WaitReason,
    beyond_quota,
    inadmissible,
    plan,
    preempted_for,
)
from trainyard.scheduling.admission.starts import (
    HISTORY_KEPT_S,
    HISTORY_READ,
    History,
    StartEstimate,
    estimate_starts,
    start_in_words,
    wait_ratio,
)
from trainyard.scheduling.ledger_db import (
    Connection,
    DatabaseUnavailable,
    LedgerAbsent,
    PostgresDb,
    open_db,
    shared_database_url,
)
from trainyard.scheduling.resources import ResourcesConfig
from trainyard.spec import Resources

if TYPE_CHECKING:
    from trainyard.scheduling.budgets import Spend

WAITING_LEASE_S = 120.0  # a waiting job looks every admission_poll_seconds; one silent for 2 min is dropped
ADMITTED_LEASE_S = 600.0  # from admission to the training task's first heartbeat (and between retries)
RUNNING_LEASE_S = 180.0  # a running training's lease, renewed by its heartbeat (lease.HEARTBEAT_S)
HOST_BEAT_S = 5.0  # a worker host announces the GPU types it serves this often (trainyard worker)
HOST_LEASE_S = 20.0  # and one silent this long serves none: its types' jobs wait for another
HOSTS_KEPT_S = 7 * 24 * 3600.0  # a host gone this long is forgotten (the last one seen is kept: still routed)
ADMISSION_TIMEOUT_S = 7 * 24 * 3600.0  # the longest a job waits for its GPUs before its run fails
ARRIVAL_KEPT_S = ADMISSION_TIMEOUT_S + 24 * 3600.0  # a job's arrival outlives its longest wait
# Runs of a training DAG in flight at once. A run that waits for GPUs holds no worker (its admit task is
# deferred), so the queue the ledger orders can be long; runs past this wait in Airflow's own run queue,
# in arrival order, before they reach the ledger.
RUNS_IN_FLIGHT = 256
LEDGER_FILE = "scheduling/admission.db"  # under TRAINYARD_HOME
# A Job's fields as the admission table's columns, in the dataclass's order
JOB_COLUMNS = 'id, team, gpu_type, slots, priority, max_hours, "user", grp, grp_limit, nodes'
_JOB_WIDTH = len(dataclasses.fields(Job))
JOB_VALUES = ", ".join("?" * _JOB_WIDTH)  # their placeholders

ENTRY_COLUMNS = (
    f"{JOB_COLUMNS}, enqueued, admitted, borrowed, lease_until, devices, host, preemptions, preempted_for, "
    "waiting_since"
)


@dataclasses.dataclass
class _Kept:
    """A PostgreSQL ledger's rows as this process last read them: (its xmin, the Entry) by job id, and the
    server they were read from: (its start, the admission table's oid, the 64-bit xid of that look)."""

    server: tuple[str, str, int] = ("", "", 0)
    rows: dict[str, tuple[str, Entry]] = dataclasses.field(default_factory=dict)


_KEPT: dict[str, _Kept] = {}  # by the database's full URL
_KEPT_LOCK = threading.Lock()


def _forget_kept() -> None:
    """In a forked child: nothing kept, and a lock no thread of the parent can have left held."""
    global _KEPT_LOCK
    _KEPT.clear()
    _KEPT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_kept)


def _entry(r: Sequence) -> Entry:
    """An admission row of :data:`ENTRY_COLUMNS` as an Entry."""
    enqueued, admitted, borrowed, lease_until, devices, host, preemptions, preempted_for, waiting_since = r[_JOB_WIDTH:]
    return Entry(
        Job(*r[:_JOB_WIDTH]),
        enqueued,
        admitted,
        borrowed,
        lease_until,
        tuple(devices.split(",")) if devices else (),
        host,
        preemptions,
        preempted_for,
        waiting_since,
    )


def _job_row(job: Job) -> tuple:
    return dataclasses.astuple(job)  # JOB_COLUMNS' order


@dataclasses.dataclass(frozen=True)
class HostRecord:
    """A worker host's announcement of one GPU type it serves, with its devices of that type."""

    host: str
    gpu_type: str
    devices: tuple[str, ...]  # () for a type whose slots are no devices (cpu)
    seen_until: float  # it serves the type until then, unless it announces itself again

    def live(self, now: float) -> bool:
        return self.seen_until > now


@dataclasses.dataclass(frozen=True)
class Stint:
    """A preempted job's time on its slots: from its admission to its requeue (epoch seconds). Airflow keeps
    one record of a task that was rescheduled, its start the last one's: these are the times it loses."""

    job_id: str  # its run key, "<dag_id>/<run_id>"
    team: str
    gpu_type: str
    slots: int
    admitted: float
    ended: float


class NotAdmitted(RuntimeError):
    """The job's reservation ran out before its training started, and it cannot be admitted again now."""


class NoFreeDevices(NotAdmitted):
    """The job is admitted, but fewer of this host's devices are free than it needs (for now)."""


class Ledger:
    """The admission state in its store (:mod:`trainyard.scheduling.ledger_db`): a SQLite file shared by the
    task processes of this host, or a PostgreSQL database shared by every host."""

    def __init__(
        self,
        where: str | Path,
        config: ResourcesConfig,
        clock: Callable[[], float] | None = None,
        host: str | None = None,
        read_only: bool = False,
    ) -> None:
        """``where``: a SQLite file's path or a ``postgresql://`` URL. ``clock``: the time leases are judged
        by; default, the store's (this host's for SQLite, the database server's for PostgreSQL). ``host``:
        the name of this worker host, whose devices it hands out (default:
        :func:`~trainyard.scheduling.hosts.host_name`). ``read_only``: for reports, which change nothing
        (:func:`~trainyard.scheduling.ledger_db.open_db`)."""
        from trainyard.scheduling.hosts import host_name

        self.db, self.config, self.clock = open_db(where, read_only), config, clock
        self.host = host or host_name()

    def _now(self, conn: Connection) -> float:
        return self.clock() if self.clock is not None else self.db.now(conn)

    def now(self) -> float:
        """The time leases are judged by (epoch seconds): what "now" is to this ledger's decisions."""
        with self.db.connection() as conn:
            return self._now(conn)

    @staticmethod
    def _entries(conn: Connection) -> list[Entry]:
        return [_entry(r) for r in conn.execute(f"SELECT {ENTRY_COLUMNS} FROM admission").fetchall()]

    def _queue(self, conn: Connection) -> list[Entry]:
        """Every row, as :meth:`_entries` reads them, for a decision (in its transaction, under the decisions'
        lock). On PostgreSQL the rows are kept between looks in this process (:class:`_Kept`) and only those
        written since are read again: a row's ``xmin`` (the transaction that wrote it) changes with every
        update, and a row deleted and made again has a new one. A look at 10,000 waiting jobs then reads
        10,000 short pairs instead of 10,000 rows of 19 columns, and makes only the changed rows anew (a look
        took half the time, and admissions a second at 10,000 waiting went from 34 to 45: BENCHMARKS.md).

        Every other write to the table takes the decisions' lock too, so the two reads see one state, but
        for columns no decision reads (``record_told_wait``) or a change made by hand in between: a row the
        first read found changed is then read as it is (left out if deleted), another as the first read saw
        it, and again at the next look. An xmin names one write only within one server's history and 2^31
        transactions: the rows kept are dropped when the server started again since (a restart, a restore, a
        promoted replica, which may hand out the same xids again), when the table was made anew, or after
        2^31 transactions. A decision must make no savepoint: a row written in one carries its subtransaction's
        xid, which the rule for this transaction's own rows below would not see."""
        if not isinstance(self.db, PostgresDb):
            return self._entries(conn)
        with _KEPT_LOCK:
            kept = _KEPT.setdefault(self.db.url, _Kept())
        started, table, xid = conn.execute(
            "SELECT pg_postmaster_start_time()::text, 'admission'::regclass::oid::text, txid_current()"
        ).fetchone()
        if kept.server[:2] != (started, table) or xid - kept.server[2] >= 2**31:
            kept.rows.clear()
        kept.server, rows = (started, table, xid), kept.rows
        if not rows:  # a first look in this process: one read of everything
            fresh = conn.execute(f"SELECT xmin::text, {ENTRY_COLUMNS} FROM admission").fetchall()
        else:
            written = dict(conn.execute("SELECT id, xmin::text FROM admission").fetchall())
            for gone in rows.keys() - written.keys():
                del rows[gone]
            stale = [i for i, xmin in written.items() if i not in rows or rows[i][0] != xmin]
            sql = f"SELECT xmin::text, {ENTRY_COLUMNS} FROM admission WHERE id = ANY(?)"
            fresh = conn.execute(sql, (stale,)).fetchall() if stale else []
            for gone in set(stale) - {r[1] for r in fresh}:  # deleted by hand since the first read
                rows.pop(gone, None)
        this = str(xid % 2**32)  # this transaction's xid, as xmin shows it
        for xmin, *row in fresh:
            # a row this transaction wrote keeps that xmin through its later writes to it (an admission below):
            # kept without one, so that the next look reads it again
            rows[row[0]] = ("" if xmin == this else xmin, _entry(row))
        return [entry for _, entry in rows.values()]

    def _here(self, host: str) -> bool:
        """Whether devices recorded for ``host`` are this host's: on a shared ledger every worker host
        numbers its GPUs from 0, so only its own rows' devices can clash with what it hands out."""
        return host in (self.host, "")

    @staticmethod
    def _drop_lapsed(conn: Connection, now: float) -> None:
        """Rows whose lease ran out go before anything is handed out: their slots and devices are free, and
        so are the devices of the nodes of a job admitted no more (released, lapsed, preempted)."""
        conn.execute("DELETE FROM admission WHERE lease_until < ?", (now,))
        conn.execute(
            "DELETE FROM job_nodes WHERE NOT EXISTS "
            "(SELECT 1 FROM admission a WHERE a.id = job_nodes.id AND a.admitted IS NOT NULL)"
        )

    def _held_here(self, conn: Connection, now: float, job_id: str, node: int | None = None) -> set[str]:
        """This host's devices that live jobs hold, but for ``job_id``'s own (its row's; with ``node``, that
        node's: the job's other nodes on this host hold theirs): a job's of one node (its row), and the
        nodes' of multi-node jobs here."""
        rows = conn.execute(
            "SELECT devices, host FROM admission WHERE id != ? AND lease_until >= ? AND devices != '' "
            "UNION ALL SELECT n.devices, n.host FROM job_nodes n JOIN admission a ON a.id = n.id "
            "WHERE NOT (n.id = ? AND n.node = ?) AND a.lease_until >= ? AND a.admitted IS NOT NULL "
            "AND n.devices != ''",
            (job_id, now, job_id, -1 if node is None else node, now),
        ).fetchall()
        return {d for devices, host in rows if self._here(host) for d in devices.split(",")}

    def _decide(self, conn: Connection, now: float, spend: Spend | None) -> dict[str, Verdict]:
        """Drop what ran out, admit what the plan admits. A job admitted on another's request keeps its
        waiting lease: if its admit task is gone (a cancelled run), its slots come back within that."""
        self._drop_lapsed(conn, now)
        conn.execute("DELETE FROM arrivals WHERE enqueued < ?", (now - ARRIVAL_KEPT_S,))
        conn.execute("DELETE FROM cancelled WHERE at < ?", (now - ARRIVAL_KEPT_S,))
        conn.execute("DELETE FROM preempted WHERE at < ?", (now - ARRIVAL_KEPT_S,))
        conn.execute("DELETE FROM holds WHERE at < ?", (now - HISTORY_KEPT_S,))
        conn.execute("DELETE FROM stints WHERE ended < ?", (now - HISTORY_KEPT_S,))
        conn.execute("DELETE FROM wait_ratios WHERE at < ?", (now - HISTORY_KEPT_S,))
        # the host seen last is kept however long ago: once routed, a fleet whose hosts are all gone says so
        conn.execute(
            "DELETE FROM hosts WHERE seen_until < ? AND seen_until < (SELECT MAX(seen_until) FROM hosts)",
            (now - HOSTS_KEPT_S,),
        )
        config = self.config
        types, teams = config.slot_types, config.teams  # once: slot_types is a property, slow to reach on a model
        entries = [e for e in self._queue(conn) if e.job.gpu_type in types and e.job.team in teams]
        verdicts = plan(config, entries, now, spend, PreemptionRules.of(config), served=self._served(conn, now))
        for job_id, verdict in verdicts.items():
            if verdict.admitted:
                sql = "UPDATE admission SET admitted = ?, borrowed = ? WHERE id = ?"
                conn.execute(sql, (now, verdict.borrowed, job_id))
                self._record_wait_ratio(conn, job_id, now)
            elif verdict.standing is Standing.PREEMPTED:  # its training hears it through its lease
                sql = "UPDATE admission SET preempted_for = ? WHERE id = ? AND admitted IS NOT NULL"
                conn.execute(sql + " AND preempted_for = ''", (verdict.preempted_for, job_id))
        return verdicts

    @staticmethod
    def _record_wait_ratio(conn: Connection, job_id: str, now: float) -> None:
        """An admitted job told a wait (:meth:`record_told_wait`): how its wait came out, for the band."""
        told = conn.execute("SELECT told_at, told_wait FROM admission WHERE id = ?", (job_id,)).fetchone()
        if told is not None and told[0] > 0:
            sql = "INSERT INTO wait_ratios (id, ratio, at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING"
            conn.execute(sql, (job_id, wait_ratio(told[1], now - told[0]), now))

    def request(self, job: Job, spend: Spend | None = None) -> Verdict:
        """Queue ``job`` or renew its place, and decide: whether it is admitted now, or why it waits. Its
        arrival is its first request's, kept apart from the lease: a job that missed a look, or whose
        training is retried, keeps its place. ``spend``: for the budget gate
        (:func:`trainyard.scheduling.budgets.current_spend`); None leaves budgets out."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            gone = conn.execute("SELECT reason FROM cancelled WHERE id = ?", (job.id,)).fetchone()
            if gone is not None:  # a look already under way when it was cancelled must not queue it again
                return Verdict(Standing.CANCELLED, gone[0])
            refused = inadmissible(self.config, job)
            if refused is not None:  # never "waiting" for a team or type that is gone: say so, queue nothing
                conn.execute("DELETE FROM admission WHERE id = ? AND admitted IS NULL", (job.id,))
                return refused
            conn.execute("INSERT INTO arrivals (id, enqueued) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", (job.id, now))
            (arrived,) = conn.execute("SELECT enqueued FROM arrivals WHERE id = ?", (job.id,)).fetchone()
            conn.execute(
                f"INSERT INTO admission ({JOB_COLUMNS}, enqueued, lease_until) VALUES ({JOB_VALUES}, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET lease_until = CASE WHEN excluded.lease_until > "
                "admission.lease_until THEN excluded.lease_until ELSE admission.lease_until END",
                (*_job_row(job), arrived, now + WAITING_LEASE_S),
            )
            earlier = conn.execute("SELECT times, at FROM preempted WHERE id = ?", (job.id,)).fetchone()
            if earlier is not None:  # a row made anew (the last one's lease ran out) keeps the job's preemptions
                sql = "UPDATE admission SET preemptions = ?, waiting_since = ? WHERE id = ? AND preemptions < ?"
                conn.execute(sql, (earlier[0], earlier[1], job.id, earlier[0]))
            verdicts = self._decide(conn, now, spend)
            row = conn.execute("SELECT admitted, borrowed FROM admission WHERE id = ?", (job.id,)).fetchone()
            if row[0] is not None:  # its training has until then to start and take over the lease
                until = now + ADMITTED_LEASE_S
                conn.execute(
                    "UPDATE admission SET lease_until = CASE WHEN lease_until > ? THEN lease_until ELSE ? END "
                    "WHERE id = ?",
                    (until, until, job.id),
                )
        if row[0] is not None:  # admitted now, or before (on another job's look)
            return Verdict.admit(job, row[1])
        return verdicts.get(job.id) or Verdict.wait(WaitReason.UNKNOWN, "waiting")

    def renew(self, job_id: str, lease_s: float = RUNNING_LEASE_S) -> bool:
        """Extend an admitted job's lease; False if it is no longer admitted. A row whose lease ran out but
        that no decision has dropped yet is renewed: nothing else can have its slots or devices."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            cur = conn.execute(
                "UPDATE admission SET lease_until = ? WHERE id = ? AND admitted IS NOT NULL", (now + lease_s, job_id)
            )
            return cur.rowcount == 1

    def reclaim(self, job: Job, devices: tuple[str, ...] = ()) -> bool:
        """A job that trains but whose row was dropped (its heartbeat missed its lease: a lock held for
        minutes, a paused VM, a clock step) takes it back, admitted, with ``devices``, if its type still
        has the slots and no live job holds one of those devices; False if not (its slots went to another
        job meanwhile, and its training must stop). Quotas and the budget are not asked again: it was
        admitted within them and is running. A multi-node job's row is not taken back: its other nodes'
        devices went with it."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            self._drop_lapsed(conn, now)
            if conn.execute("SELECT 1 FROM cancelled WHERE id = ?", (job.id,)).fetchone():
                return False  # taken out of the queue: its training stops
            if conn.execute("SELECT 1 FROM admission WHERE id = ? AND admitted IS NOT NULL", (job.id,)).fetchone():
                conn.execute("UPDATE admission SET lease_until = ? WHERE id = ?", (now + RUNNING_LEASE_S, job.id))
                return True
            conn.execute("DELETE FROM admission WHERE id = ?", (job.id,))  # a waiting row of its own, if any
            live = [e for e in self._entries(conn) if e.admitted is not None]
            if job.gpu_type not in self.config.slot_types or job.team not in self.config.teams:
                return False
            if job.nodes > 1:  # its nodes' devices went with its row: another job may have them now
                return False
            # counted from the rows themselves: one may be of a team this process's config does not know yet
            of_type = [e.job for e in live if e.job.gpu_type == job.gpu_type]
            if sum(j.slots for j in of_type) + job.slots > self.config.slot_types[job.gpu_type].slots:
                return False
            if set(devices) & self._held_here(conn, now, job.id):
                return False
            (arrived,) = conn.execute(
                "SELECT coalesce(min(enqueued), ?) FROM arrivals WHERE id = ?", (now, job.id)
            ).fetchone()
            team_used = sum(j.slots for j in of_type if j.team == job.team)
            borrowed = beyond_quota(team_used, job.slots, self.config.quota(job.team, job.gpu_type))
            conn.execute(
                f"INSERT INTO admission ({JOB_COLUMNS}, enqueued, admitted, borrowed, devices, host, lease_until) "
                f"VALUES ({JOB_VALUES}, ?, ?, ?, ?, ?, ?)",
                (*_job_row(job), arrived, now, borrowed, ",".join(devices), self.host, now + RUNNING_LEASE_S),
            )
            return True

    def preempted_for(self, job_id: str) -> str | None:
        """The job that ``job_id`` is preempted for (the word its training's lease listens for), or None."""
        with self.db.connection() as conn:
            row = conn.execute("SELECT preempted_for FROM admission WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row and row[0] else None

    def requeue(self, job_id: str) -> None:
        """A preempted job whose workers have ended: its slots and devices go (to the job it was preempted
        for, at that job's next look), and it waits again, in its old place (its arrival is kept; the wait
        bound counts from now: it has run), one preemption more on its count. The stint it held its slots goes
        into :meth:`stints`."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            conn.execute(
                "INSERT INTO stints (id, team, gpu_type, slots, admitted, ended) "
                "SELECT id, team, gpu_type, slots, admitted, ? FROM admission "
                "WHERE id = ? AND admitted IS NOT NULL ON CONFLICT (id, admitted) DO NOTHING",
                (now, job_id),
            )
            conn.execute(
                "INSERT INTO preempted (id, times, at) VALUES (?, 1, ?) "
                "ON CONFLICT (id) DO UPDATE SET times = preempted.times + 1, at = excluded.at",
                (job_id, now),
            )
            (times,) = conn.execute("SELECT times FROM preempted WHERE id = ?", (job_id,)).fetchone()
            conn.execute("DELETE FROM job_nodes WHERE id = ?", (job_id,))
            conn.execute(
                "UPDATE admission SET admitted = NULL, borrowed = 0, devices = '', host = '', preempted_for = '', "
                "told_at = 0, preemptions = ?, waiting_since = ?, lease_until = ? WHERE id = ?",
                (times, now, now + WAITING_LEASE_S, job_id),
            )

    def release(self, job_id: str) -> None:
        """The job is done (its training ended for good, or it gave up waiting): its slots and its place
        go; the next look of a waiting job takes them. An admitted job's hold (how long it held its slots, as
        a share of its max_hours) goes into the history the start estimates read (:meth:`history`). (A job
        cancelled or lapsed while it runs leaves none; a preempted one, its last stint's.)"""
        with self.db.transaction() as conn:
            now = self._now(conn)
            row = conn.execute("SELECT team, admitted, max_hours FROM admission WHERE id = ?", (job_id,)).fetchone()
            if row is not None and row[1] is not None and row[2] > 0:
                share = min(1.0, max(0.0, (now - row[1]) / (row[2] * 3600)))
                conn.execute(
                    "INSERT INTO holds (id, team, share, at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET team = excluded.team, share = excluded.share, at = excluded.at",
                    (job_id, row[0], share, now),
                )
            conn.execute("DELETE FROM admission WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM job_nodes WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM arrivals WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM preempted WHERE id = ?", (job_id,))

    def cancel(self, job_id: str, reason: str) -> None:
        """Take the job out of the queue for good (``trainyard queue cancel``): its row, slots and place go,
        and no later look or heartbeat of its tasks, already under way, can bring it back (its training, if
        it runs, stops at its next heartbeat)."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM admission WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM job_nodes WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM arrivals WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM preempted WHERE id = ?", (job_id,))
            conn.execute(
                "INSERT INTO cancelled (id, at, reason) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET at = excluded.at, reason = excluded.reason",
                (job_id, self._now(conn), reason),
            )

    def cancelled(self, job_id: str) -> str | None:
        """Why the job was taken out of the queue, or None if it was not."""
        with self.db.connection() as conn:
            row = conn.execute("SELECT reason FROM cancelled WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    def withdraw(self, job_id: str) -> None:
        """The job stopped waiting (its task was cancelled): its row and any slots it holds go now; its
        arrival stays (it runs out by itself), so a job withdrawn by mistake that asks again keeps its place."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM admission WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM job_nodes WHERE id = ?", (job_id,))

    def claim_devices(self, job_id: str, count: int, available: list[str], node: int | None = None) -> list[str]:
        """``count`` of this host's devices (``available``: CUDA indices or MIG UUIDs) for an admitted job,
        none of them held by another live job; the same ones again for a job that has them (a retry). They
        go with the job's admission row, so they come back when it is released or its lease runs out. ``node``:
        for that node of a multi-node job, on the host it runs on (:meth:`node_devices` has them all).
        NoFreeDevices when fewer are free (the task waits and tries again)."""
        if count > len(available):
            raise PermanentError(
                f"job {job_id} needs {count} device(s) and this host has {len(available)} "
                f"({available}); ask for fewer, or give this GPU type's pool no more slots than its host has"
            )
        with self.db.transaction() as conn:
            now = self._now(conn)
            # a row whose lease ran out is dropped, not merely passed over: its job can then only take its
            # devices back through reclaim, which checks that nobody was handed them meanwhile
            self._drop_lapsed(conn, now)
            row = conn.execute(
                "SELECT devices, host FROM admission WHERE id = ? AND admitted IS NOT NULL AND lease_until >= ?",
                (job_id, now),
            ).fetchone()
            if row is None:
                raise NotAdmitted(f"job {job_id} is not admitted: no devices for it")
            if node is not None:
                found = conn.execute(
                    "SELECT devices, host FROM job_nodes WHERE id = ? AND node = ?", (job_id, node)
                ).fetchone()
                row = found or ("", "")
            if row[0] and self._here(row[1]):  # a retry on the same host: the same ones
                if node is not None:  # and no endpoint of the try before it
                    conn.execute("UPDATE job_nodes SET endpoint = '' WHERE id = ? AND node = ?", (job_id, node))
                return row[0].split(",")
            # (a retry on another host claims this host's devices anew)
            held = self._held_here(conn, now, job_id, node)
            free = [d for d in available if d not in held]
            if len(free) < count:
                raise NoFreeDevices(
                    f"job {job_id} needs {count} device(s); this host has {len(available)}, "
                    f"{len(free)} free ({sorted(held)} held by other jobs)"
                )
            claimed = ",".join(free[:count])
            if node is None:
                conn.execute("UPDATE admission SET devices = ?, host = ? WHERE id = ?", (claimed, self.host, job_id))
            else:
                conn.execute(
                    "INSERT INTO job_nodes (id, node, host, devices) VALUES (?, ?, ?, ?) ON CONFLICT (id, node) "
                    "DO UPDATE SET host = excluded.host, devices = excluded.devices, endpoint = ''",
                    (job_id, node, self.host, claimed),
                )
            return free[:count]

    def join_node(self, job_id: str, node: int, endpoint: str = "") -> None:
        """Node ``node`` of the admitted multi-node job ``job_id`` runs on this host (a type whose slots are
        no devices claims none); node 0 says where its rendezvous store is served (``endpoint``,
        ``address:port``) for the others to find (:meth:`endpoint`). NotAdmitted where the job is not."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            live = conn.execute(
                "SELECT 1 FROM admission WHERE id = ? AND admitted IS NOT NULL AND lease_until >= ?", (job_id, now)
            ).fetchone()
            if live is None:
                raise NotAdmitted(f"job {job_id} is not admitted: its node {node} cannot join it")
            conn.execute(
                "INSERT INTO job_nodes (id, node, host, endpoint) VALUES (?, ?, ?, ?) ON CONFLICT (id, node) "
                "DO UPDATE SET host = excluded.host, endpoint = excluded.endpoint",
                (job_id, node, self.host, endpoint),
            )

    def leave_node(self, job_id: str, node: int) -> None:
        """Node ``node`` of ``job_id`` ended here (its try is over): its devices are free at once, and node
        0's endpoint goes, so that no later node joins a store that is gone."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM job_nodes WHERE id = ? AND node = ?", (job_id, node))

    def endpoint(self, job_id: str) -> str | None:
        """Where node 0 of the admitted multi-node job ``job_id`` serves its rendezvous store, once it said so
        (and until its try ends)."""
        with self.db.connection() as conn:
            row = conn.execute(
                "SELECT n.endpoint FROM job_nodes n JOIN admission a ON a.id = n.id "
                "WHERE n.id = ? AND n.node = 0 AND a.admitted IS NOT NULL AND a.lease_until >= ?",
                (job_id, self._now(conn)),
            ).fetchone()
        return row[0] if row and row[0] else None

    def queued(self, job_id: str) -> bool:
        """Whether ``job_id`` has a row in the queue now, waiting or admitted."""
        with self.db.connection() as conn:
            return conn.execute("SELECT 1 FROM admission WHERE id = ?", (job_id,)).fetchone() is not None

    def node_devices(self, job_id: str) -> dict[int, tuple[str, tuple[str, ...]]]:
        """Each node of the multi-node job ``job_id`` that runs: node -> (its host, its devices there)."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT node, host, devices FROM job_nodes WHERE id = ?", (job_id,)).fetchall()
        return {node: (host, tuple(devices.split(",")) if devices else ()) for node, host, devices in rows}

    def finished(self, job_id: str) -> bool:
        """Whether ``job_id`` held its admission and gave it back for good (released: its hold is in the
        history), and is not queued again since."""
        with self.db.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM holds h WHERE h.id = ? AND NOT EXISTS (SELECT 1 FROM admission a WHERE a.id = h.id)",
                (job_id,),
            ).fetchone()
        return row is not None

    def admitted(self, job_id: str, live: bool = True) -> bool:
        """Whether ``job_id`` is admitted now (a multi-node job's other nodes follow node 0's hold); with
        ``live`` False, also while its lease has run out and no decision has dropped its row yet (its holder
        may still renew it: a database that was down)."""
        with self.db.connection() as conn:
            now = self._now(conn) if live else -math.inf
            row = conn.execute(
                "SELECT 1 FROM admission WHERE id = ? AND admitted IS NOT NULL AND lease_until >= ?", (job_id, now)
            ).fetchone()
        return row is not None

    def announce(self, by_type: Mapping[str, Sequence[str]], lease_s: float = HOST_LEASE_S) -> None:
        """This host (``self.host``) serves ``by_type``'s GPU types, each with those devices, for ``lease_s``:
        what a worker says while it runs (``trainyard worker``, every :data:`HOST_BEAT_S`). Once any host has
        announced itself, a job of a type no live host serves waits, saying so (:func:`~.policy.unserved`).
        One statement per type, outside the decisions' lock (hundreds of hosts beat without queueing behind
        a decision); a type the host stops listing lapses by itself, and two workers of one host name
        serving different types each keep theirs."""
        with self.db.connection() as conn:
            now = self._now(conn)
            for gpu_type, devices in by_type.items():
                conn.execute(
                    "INSERT INTO hosts (host, gpu_type, devices, seen_until) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (host, gpu_type) DO UPDATE SET devices = excluded.devices, "
                    "seen_until = excluded.seen_until",
                    (self.host, gpu_type, ",".join(devices), now + lease_s),
                )

    def retire(self, by_type: Mapping[str, Sequence[str]]) -> None:
        """This host serves ``by_type``'s types no more (its worker is ending): their waiting jobs wait for
        another host's worker. The records stay, so types are still routed (:data:`HOSTS_KEPT_S`)."""
        with self.db.connection() as conn:
            now = self._now(conn)
            for gpu_type in by_type:
                conn.execute(
                    "UPDATE hosts SET seen_until = ? WHERE host = ? AND gpu_type = ? AND seen_until > ?",
                    (now, self.host, gpu_type, now),
                )

    def hosts(self) -> list[HostRecord]:
        """Every host's announcements, the lapsed ones too (:meth:`HostRecord.live` says which serve now)."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT host, gpu_type, devices, seen_until FROM hosts ORDER BY host, gpu_type")
            return [HostRecord(h, t, tuple(d.split(",")) if d else (), until) for h, t, d, until in rows.fetchall()]

    @staticmethod
    def _served(conn: Connection, now: float) -> dict[str, tuple[float, ...]] | None:
        """GPU type -> how many of its devices each live host serving it has, most first (``math.inf`` for a
        type whose slots are no devices), for :func:`~.policy.plan`; None where no host ever announced itself
        (one host, LocalExecutor: its trainings run wherever Airflow runs its tasks)."""
        rows = conn.execute("SELECT gpu_type, devices, seen_until FROM hosts").fetchall()
        if not rows:
            return None
        served: dict[str, list[float]] = {}
        for gpu_type, devices, until in rows:
            if until > now:
                served.setdefault(gpu_type, []).append(len(devices.split(",")) if devices else math.inf)
        return {gpu_type: tuple(sorted(counts, reverse=True)) for gpu_type, counts in served.items()}

    def served(self) -> dict[str, tuple[float, ...]] | None:
        """:meth:`_served` now."""
        with self.db.connection() as conn:
            return self._served(conn, self._now(conn))

    def history(self) -> History:
        """How long the most recent finished jobs held their slots, per team, and how the most recent
        admitted jobs' waits came out against the waits they were told (each at most
        :data:`~.starts.HISTORY_READ`, of the last :data:`~.starts.HISTORY_KEPT_S`): the estimates' history."""
        with self.db.connection() as conn:
            since = self._now(conn) - HISTORY_KEPT_S
            holds = conn.execute(
                "SELECT team, share FROM holds WHERE at >= ? ORDER BY at DESC LIMIT ?", (since, HISTORY_READ)
            ).fetchall()
            ratios = conn.execute(
                "SELECT ratio FROM wait_ratios WHERE at >= ? ORDER BY at DESC LIMIT ?", (since, HISTORY_READ)
            ).fetchall()
        return History.of(((team, share) for team, share in holds), (r for (r,) in ratios))

    def stints(self, since: float, until: float) -> list[Stint]:
        """The stints of preempted jobs (:class:`Stint`) that overlap ``since``..``until`` (epoch seconds),
        oldest first."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT id, team, gpu_type, slots, admitted, ended FROM stints WHERE ended >= ? AND admitted <= ? "
                "ORDER BY admitted",
                (since, until),
            ).fetchall()
        return [Stint(*row) for row in rows]

    def record_told_wait(self, job_id: str, told_at: float, wait_s: float) -> None:
        """The waiting job ``job_id`` was told at ``told_at`` that it waits about ``wait_s`` more (its first
        expected start; later ones change nothing): kept with its row, and how its wait comes out goes into
        the record the band is drawn from (at its admission). One statement, no decision's lock. (A job that
        leaves the queue unadmitted records nothing: the record leans to the waits that ended.)"""
        with self.db.connection() as conn:
            conn.execute(
                "UPDATE admission SET told_at = ?, told_wait = ? WHERE id = ? AND admitted IS NULL AND told_at = 0",
                (told_at, max(0.0, wait_s), job_id),
            )

    def entries(self) -> list[Entry]:
        """Every live row (leases not run out), for reports and tests."""
        with self.db.connection() as conn:
            now = self._now(conn)
            return [e for e in self._entries(conn) if e.lease_until >= now]

    def admitted_ids(self, conn: Connection) -> set[str]:
        """The jobs admitted now (leases not run out), read on ``conn``: a ``self.db.connection()`` that a
        watcher keeps open (``trainyard_airflow.triggers.admission.AdmissionWatch``)."""
        now = self._now(conn)
        rows = conn.execute("SELECT id FROM admission WHERE admitted IS NOT NULL AND lease_until >= ?", (now,))
        return {r[0] for r in rows.fetchall()}

    def standing(self, spend: Spend | None = None) -> list[tuple[Entry, Verdict]]:
        """Every live job with what the ledger says of it now, without changing anything: an admitted
        job's share, or why a waiting one waits, the verdicts its ``admit`` task logs (the same
        :func:`~trainyard.scheduling.admission.policy.plan`). Admitted jobs first, oldest first, then the
        waiting in the order the policy looks at them (their places in the queue)."""
        with self.db.connection() as conn:
            now = self._now(conn)
            entries = [e for e in self._entries(conn) if e.lease_until >= now]
            served = self._served(conn, now)
        known = [e for e in entries if e.job.gpu_type in self.config.slot_types and e.job.team in self.config.teams]
        verdicts = plan(self.config, known, now, spend, PreemptionRules.of(self.config), served=served)
        place = {job_id: i for i, job_id in enumerate(verdicts)}
        rows = []
        for e in sorted(entries, key=lambda e: (e.admitted is None, place.get(e.job.id, len(place)), e.enqueued)):
            if e.admitted is not None and e.preempted_for:
                preemptor = next((p.job for p in entries if p.job.id == e.preempted_for), None)
                rows.append((e, preempted_for(preemptor) if preemptor else Verdict(Standing.PREEMPTED, "preempted")))
            elif e.admitted is not None:
                rows.append((e, Verdict.admit(e.job, e.borrowed)))
            elif e not in known:
                rows.append((e, inadmissible(self.config, e.job) or Verdict.wait(WaitReason.UNKNOWN, "")))
            elif verdicts[e.job.id].admitted:
                rows.append((e, Verdict.wait(WaitReason.FITS_NOW, "fits now: admitted at its next look")))
            else:
                rows.append((e, verdicts[e.job.id]))
        return rows


def ledger_location() -> str | Path:
    """Where this installation's ledger is: ``$TRAINYARD_DATABASE_URL`` (PostgreSQL, the cluster profile)
    when set, else ``$TRAINYARD_HOME/scheduling/admission.db`` (SQLite, this host)."""
    from trainyard import paths

    return shared_database_url() or paths.home() / LEDGER_FILE


def default_ledger(config: ResourcesConfig | None = None) -> Ledger:
    """This installation's ledger (:func:`ledger_location`) over the resources in force
    (:func:`~trainyard.scheduling.resources.resources_in_force`). Refused without an explicit
    TRAINYARD_HOME: the triggerer, the ``admit`` task and the training must share one ledger (and one runs
    root, where the budget gate reads the spend), and a process that fell back to ``./var`` would queue
    against an empty one and admit everything."""
    import os

    from trainyard.scheduling.resources import resources_in_force

    if not os.environ.get("TRAINYARD_HOME"):
        raise PermanentError(
            "the admission queue needs TRAINYARD_HOME set, the same for every Airflow process "
            "(scheduler, triggerer, workers): `make up` sets it; export it where you start Airflow yourself"
        )
    return Ledger(ledger_location(), config or resources_in_force())


def existing_ledger(config: ResourcesConfig | None = None, read_only: bool = True) -> Ledger | None:
    """This installation's ledger, over ``config`` or the resources in force, if a job was ever queued in
    it, else None: for reports and checks, which must not create a SQLite file (and work without
    TRAINYARD_HOME). Read-only by default: a report changes nothing in it, not even an earlier version's
    schema (:class:`~trainyard.scheduling.ledger_db.LedgerOutdated`). ``read_only=False``: for a pipeline's
    task or a cancel, which run with the writer's rights and bring an earlier version's ledger (or a new
    cluster's empty database) up to date rather than fail."""
    from trainyard.scheduling.resources import resources_in_force

    where = ledger_location()
    if isinstance(where, Path) and not where.is_file():
        return None
    try:
        return Ledger(where, config or resources_in_force(), read_only=read_only)
    except LedgerAbsent:
        return None


def look(ledger: Ledger, job: Job) -> Verdict:
    """One look of a waiting job: its request, with this month's spend of every team for the budget gate."""
    from trainyard import paths
    from trainyard.scheduling.budgets import current_spend, fill_journal

    try:
        fill_journal(ledger.config, paths.runs_root())  # once per installation: then a no-op
    except OSError as err:  # the spend is read from the usage files meanwhile: the queue goes on
        logging.getLogger(__name__).warning("could not fill the spend journal (%s); looking without it", err)
    return ledger.request(job, current_spend(ledger.config, paths.runs_root()))


def queue_places(entries: list[Entry]) -> dict[str, tuple[int, int]]:
    """Each waiting job's place among the jobs waiting for its GPU type, (k, n), in the order of ``entries``
    (:meth:`Ledger.standing`'s: the order the policy looks at them)."""
    of_type: dict[str, list[str]] = {}
    for e in entries:
        if e.admitted is None:
            of_type.setdefault(e.job.gpu_type, []).append(e.job.id)
    return {job_id: (i + 1, len(ids)) for ids in of_type.values() for i, job_id in enumerate(ids)}


_starts_lock = threading.Lock()
_starts: tuple[tuple, float, dict[str, StartEstimate]] | None = None  # the queue's state, when, and its starts
STARTS_KEPT_S = 60.0


def starts_of(ledger: Ledger, entries: list[Entry], now: float, spend: Spend | None) -> dict[str, StartEstimate]:
    """:func:`~.starts.estimate_starts` of the queue ``entries`` with the ledger's history, computed once per
    state of the queue (and at least every :data:`STARTS_KEPT_S`): every waiting job of a triggerer logs its
    start as the queue changes, and running the policy forward twice costs 0.2 CPU-s with 10,000 jobs
    waiting (bench/admission_scale.py)."""
    global _starts
    served = ledger.served()
    state = (tuple(sorted((e.job.id, e.admitted, e.preempted_for) for e in entries)), served)
    with _starts_lock:
        if _starts is not None and _starts[0] == state and now - _starts[1] < STARTS_KEPT_S:
            return _starts[2]
        found = estimate_starts(ledger.config, entries, now, spend, ledger.history(), served=served)
        _starts = (state, now, found)
        return found


def place_in_queue(ledger: Ledger, job_id: str, told: bool = False) -> str | None:
    """Where the waiting job ``job_id`` stands, in the words ``trainyard queue`` and the ``admit`` task's log
    use: "waiting, 2 of 3 for a100: <why>; expected to start about <time> ...; starts by <time> if ..." (the
    jobs of its GPU type that wait, in the order the policy looks at them; its start,
    :func:`~.starts.estimate_starts`); None when it is not waiting (admitted, or not in the ledger).
    ``told``: the job itself is told (its ``admit`` task's log): its first expected start is kept
    (:meth:`Ledger.record_told_wait`)."""
    from trainyard import paths
    from trainyard.scheduling.budgets import current_spend

    spend = current_spend(ledger.config, paths.runs_root())
    rows = ledger.standing(spend)
    mine = next(((e, verdict) for e, verdict in rows if e.job.id == job_id), None)
    if mine is None or mine[0].admitted is not None:
        return None
    entries = [e for e, _ in rows]
    k, n = queue_places(entries)[job_id]
    now = ledger.now()
    estimate = starts_of(ledger, entries, now, spend).get(job_id)
    if told and estimate is not None and estimate.expected is not None:
        try:
            ledger.record_told_wait(job_id, now, estimate.expected - now)
        except DatabaseUnavailable as err:  # the record misses one wait; the job's log line still says it
            logging.getLogger(__name__).warning("could not record the wait told to %s: %s", job_id, err)
    start = start_in_words(estimate, now)
    place = f"waiting, {k} of {n} for {mine[0].job.gpu_type}"
    why = mine[1].message.removeprefix(f"{mine[0].job.gpu_type}: ")  # "for cpu: 2 of 2 slots", not "cpu: cpu:"
    return f"{place}: {why}; {start}"


def verdict_in_words(ledger: Ledger, job_id: str, verdict: Verdict, since: float | None = None) -> str:
    """A look's verdict as the ``admit`` task logs it: a waiting job's place in its queue, with how long it
    has waited since ``since`` (epoch seconds), else the verdict's message."""
    if verdict.standing is not Standing.WAITING:
        return verdict.message
    try:
        said = place_in_queue(ledger, job_id, told=True) or f"waiting: {verdict.message}"
    except Exception as err:  # noqa: BLE001 - a second read for a log line's detail never fails the look
        said = f"waiting: {verdict.message} (its place unknown: {err})"
    return f"{said} (waiting {(time.time() - since) / 60:.0f} min)" if since else said


def job_for(res: Resources, run_key: str, user: str | None = None, group: str = "", group_limit: int = 0) -> Job:
    """The ledger's view of a run's JobSpec (its ``resources``), triggered by ``user``; a sweep's trial is
    one of ``group``, of which at most ``group_limit`` are admitted at once. Its ``gpu_type`` is the type its
    slots are counted in (:attr:`~trainyard.spec.Resources.slot_type`: on a MIG type, its profile's slices)."""
    return Job(
        run_key,
        res.team,
        res.slot_type,
        res.total_gpus,
        res.priority,
        res.max_hours,
        user or "",
        group,
        group_limit,
        res.nodes,
    )
