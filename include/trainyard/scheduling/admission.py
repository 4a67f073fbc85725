"""Admission: which waiting job may take its GPUs now, within every team's quota and what it may borrow.

Airflow's GPU pool of a type bounds the GPUs in use (a training task holds pool_slots = its GPUs), but a
pool knows nothing of teams, and when the first waiting task does not fit it starts smaller ones behind
it, so a large job can wait forever. The ledger here adds what pools lack, and nothing else:

* a job's training starts only once the ledger admits it; the ``admit`` task of ``train_pipeline`` waits
  for that deferred, its looks made by a trigger in Airflow's triggerer (no worker held or started while
  it waits; ``trainyard_airflow.triggers.admission``);
* never more slots of a type admitted than it has; a team never above its quota plus what it may borrow;
  borrowing only from what other teams lend of their idle quota and from slots in nobody's quota, and
  what a team does not lend stays its own: a lender taking its lent quota back waits for the borrowers
  to finish rather than take another team's reserve (``ResourcesConfig.lent``);
* order among waiting jobs of a type: a job that waited ``scheduling.max_wait_minutes`` first; then jobs
  within their team's quota before jobs that would borrow; then ``resources.priority``; then arrival;
* a job that does not fit does not stop smaller ones behind it (backfill: the fleet stays busy), except
  that (a) behind a job within its quota that waits for slots, no job may borrow (lent quota comes back as
  the borrowers finish; nothing running is preempted), and (b) a job that has waited
  ``max_wait_minutes`` for slots holds a reservation: the time by which enough slots are free for it if
  every running job ends by its ``max_hours`` (:func:`_reserved_start`). No job that would borrow and no
  job of its own team starts if it could keep it from starting then (:func:`_would_delay`): one that ends
  by then at the latest, or leaves it room then by every limit, still does (EASY backfill, as in Slurm);
  other teams keep their own quota. So it starts by its reservation at the latest, sooner as running jobs
  end early: the bound on how long a large job waits behind a stream of small ones, without the fleet
  idling while it drains;
* a team's admitted jobs' commitments (each a worst case, price x max_hours x slots, less what its run
  spent) stay within what its monthly budget has left after the month's spend.

Every decision is one transaction that no other decision interleaves with, so concurrent task processes
see one order: on a SQLite file of this host (the embedded default) or on a PostgreSQL database that every
host reaches (``TRAINYARD_DATABASE_URL``, the cluster profile); :mod:`trainyard.scheduling.ledger_db`.

Nothing leaks when a process dies: every row has a lease. A waiting job's lease is renewed by
each look of its ``admit`` task (its trigger), an admitted job's by its training task (:func:`hold`, a heartbeat
thread); a row whose lease ran out is dropped by the next decision, so a killed worker, a cancelled run or
a crashed scheduler frees its slots within one lease. A job's arrival is kept apart from its lease, so a
missed look or a retried training keeps its place in the queue. A SQLite file must be on a local disk
(SQLite's locking does not hold on network filesystems): one host, as with Airflow's LocalExecutor; workers
on several hosts share the PostgreSQL ledger, whose leases are judged by the database server's clock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError, RetryableError, is_permanent
from trainyard.scheduling.ledger_db import Connection, DatabaseUnavailable, open_db, shared_database_url
from trainyard.scheduling.resources import ResourcesConfig

if TYPE_CHECKING:
    from trainyard.scheduling.budgets import Spend
from trainyard.spec import Resources

WAITING_LEASE_S = 120.0  # a waiting job looks every admission_poll_seconds; one silent for 2 min is dropped
ADMITTED_LEASE_S = 600.0  # from admission to the training task's first heartbeat (and between retries)
HEARTBEAT_S = 30.0  # a running training renews its lease this often ...
RUNNING_LEASE_S = 180.0  # ... for this long
ADMISSION_TIMEOUT_S = 7 * 24 * 3600.0  # the longest a job waits for its GPUs before its run fails
ARRIVAL_KEPT_S = ADMISSION_TIMEOUT_S + 24 * 3600.0  # a job's arrival outlives its longest wait
# Runs of a training DAG in flight at once. A run that waits for GPUs holds no worker (its admit task is
# deferred), so the queue the ledger orders can be long; runs past this wait in Airflow's own run queue,
# in arrival order, before they reach the ledger.
RUNS_IN_FLIGHT = 256
LEDGER_FILE = "scheduling/admission.db"  # under TRAINYARD_HOME


@dataclass(frozen=True)
class Job:
    id: str  # the run key: "<dag_id>/<run_id>"
    team: str
    gpu_type: str
    slots: int
    priority: int
    max_hours: float  # resources.max_hours: its worst case counts against the team's budget while admitted
    user: str = ""  # who triggered the run ("" for a schedule): shown by `trainyard queue`
    group: str = ""  # a sweep's trials share one: its run key
    group_limit: int = 0  # at most this many jobs of the group admitted at once (sweep.parallelism); 0: any


@dataclass(frozen=True)
class Entry:
    job: Job
    enqueued: float
    admitted: float | None  # None while waiting
    borrowed: int  # slots beyond the team's quota when it was admitted
    lease_until: float
    devices: tuple[str, ...] = ()  # the GPUs of ``host`` it was given (claim_devices)
    host: str = ""  # the worker host whose devices those are ("": a ledger of one host, from before hosts)


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str  # why it waits, or what it got
    cancelled: bool = False  # the job was taken out of the queue (trainyard queue cancel): it never starts
    inadmissible: bool = False  # its team or GPU type is not in the resources in force: it never starts

    @property
    def final(self) -> bool:
        """Whether the job will never be admitted: its task ends failed, with ``reason``."""
        return self.cancelled or self.inadmissible


def inadmissible_reason(config: ResourcesConfig, job: Job) -> str | None:
    """Why ``job`` can never be admitted under ``config`` (its team or GPU type is not in it), or None."""
    if job.team in config.teams and job.gpu_type in config.gpu_types:
        return None
    missing = [
        f"{what} {name!r} is not in resources.yaml (it lists {sorted(listed)})"
        for what, name, listed in (("team", job.team, config.teams), ("GPU type", job.gpu_type, config.gpu_types))
        if name not in listed
    ]
    return f"inadmissible: {'; '.join(missing)}; trigger the job again with one it lists, or add it back"


def _usage(config: ResourcesConfig, entries: list[Entry], gpu_type: str) -> dict[str, int]:
    used = dict.fromkeys(config.teams, 0)
    for e in entries:
        if e.admitted is not None and e.job.gpu_type == gpu_type:
            used[e.job.team] += e.job.slots
    return used


TEAM, FLEET = "team", "fleet"  # what stops a job: its team's own limits, or the fleet's slots


def _room(config: ResourcesConfig, used: dict[str, int], job: Job) -> tuple[int | None, str, str]:
    """(slots it would borrow, "", "") if ``job`` fits now, else (None, why not, TEAM or FLEET)."""
    t, team = job.gpu_type, job.team
    capacity = config.gpu_types[t].slots
    in_use = sum(used.values())
    quota = config.quota(team, t)
    borrow = max(0, used[team] + job.slots - max(quota, used[team]))  # new slots beyond the quota
    limit = config.borrowing_limit(team, t)
    if borrow and limit is not None and max(0, used[team] - quota) + borrow > limit:
        return None, f"team {team} holds {used[team]} of quota {quota} and may borrow at most {limit}", TEAM
    if in_use + job.slots > capacity:
        return None, f"{t}: {in_use} of {capacity} slots in use, the job needs {job.slots}", FLEET
    borrowed, lendable = config.lent(t, {**used, team: used[team] + job.slots})
    before = config.lent(t, used)
    # A job may not make the fleet lend more than the lending limits allow; where it already does (limits
    # lowered in the file since), a job that makes it no worse still starts.
    if borrowed - lendable > max(0, before[0] - before[1]):
        if borrow:  # what was lendable before this job
            left = lendable - (borrowed - borrow)
            return None, f"{t}: the job would borrow {borrow} slots, {max(left, 0)} are lendable now", FLEET
        # A lender taking its quota back while borrowers hold it: the free slots are other teams' reserve
        # (what they do not lend). It starts as the borrowers finish; nothing running is preempted.
        return (
            None,
            f"{t}: team {team}'s quota is lent out and the free slots are other teams' reserve; "
            "it starts as the borrowers finish",
            FLEET,
        )
    return borrow, "", ""


def _reserved_start(free: int, running: list[tuple[float, int, str]], need: int, now: float) -> float:
    """The time by which ``need`` slots are free at the latest, with ``free`` free now and ``running``
    the (end by its max_hours, slots, team) of the jobs holding the rest; one past its end counts as
    ending now."""
    at = now
    for end, slots, _ in sorted(running):
        if free >= need:
            break
        free += slots
        at = max(at, end)
    return at


def _would_delay(
    config: ResourcesConfig,
    starving: Job,
    job: Job,
    used: dict[str, int],
    running: list[tuple[float, int, str]],
    now: float,
) -> bool:
    """Whether admitting ``job`` now could keep ``starving`` from starting at its reserved start: the
    time enough slots are free if every running job ends by its max_hours. With ``job`` admitted, the jobs
    still running then (``job`` too, unless it ends by then) must leave the starving job room by every
    rule of :func:`_room`: the slots, its team's borrowing limit, and what the others lend. A starving job
    that a limit other than the slots holds back has no room at its reserved start either, so nothing
    that borrows or is of its team passes it."""
    capacity = config.gpu_types[starving.gpu_type].slots
    reserved = _reserved_start(capacity - sum(used.values()), running, starving.slots, now)
    then = dict.fromkeys(used, 0)
    for end, slots, team in [*running, (now + job.max_hours * 3600, job.slots, job.team)]:
        if reserved <= now or end > reserved:
            then[team] += slots
    return _room(config, then, starving)[0] is None


def _seen_by_all(job: Job) -> str:
    """Another job named in a waiting job's reason, which that job's team reads (its admit log, ``trainyard
    queue``): as its team and size, what anyone may see of it (``trainyard.teams.SEEN_BY_OTHERS``)."""
    return f"team {job.team}'s job of {job.slots} {job.gpu_type} slot(s)"


def plan(
    config: ResourcesConfig, entries: list[Entry], now: float, spend: Spend | None = None
) -> dict[str, tuple[int | None, str]]:
    """Every waiting job's verdict now: job id -> (slots borrowed, "") to admit it, or (None, why it
    waits). ``spend``: with it, a job is admitted only while its commitment and those of its team's
    admitted jobs and Kubernetes trainings (:func:`trainyard.scheduling.budgets.commitment`) fit in what
    the team's monthly budget has left after this month's spend. Pure: the ledger applies it in one transaction."""
    from trainyard.scheduling.budgets import commitment

    max_wait = config.scheduling.max_wait_minutes * 60

    def owed(job: Job) -> float:
        """The job's commitment where a budget gates its team (reading its run's usage file), else 0."""
        if spend is None or config.teams[job.team].monthly_budget is None:
            return 0.0
        return commitment(config, job, spend.of_run(job.id))

    committed = dict.fromkeys(config.teams, 0.0)
    in_group: dict[str, int] = {}  # a sweep's admitted trials
    for e in entries:
        if e.admitted is not None:
            committed[e.job.team] += owed(e.job)
            in_group[e.job.group] = in_group.get(e.job.group, 0) + 1
    verdicts: dict[str, tuple[int | None, str]] = {}
    for gpu_type in config.gpu_types:
        used = _usage(config, entries, gpu_type)
        waiting = [e for e in entries if e.admitted is None and e.job.gpu_type == gpu_type]
        running = [  # (when it ends at the latest, slots, team): what a reservation counts on
            (e.admitted + e.job.max_hours * 3600, e.job.slots, e.job.team)
            for e in entries
            if e.admitted is not None and e.job.gpu_type == gpu_type
        ]

        def within(job: Job, used: dict[str, int] = used, gpu_type: str = gpu_type) -> bool:
            return used[job.team] + job.slots <= config.quota(job.team, gpu_type)

        def key(e: Entry, within=within) -> tuple:
            return (now - e.enqueued < max_wait, not within(e.job), -e.job.priority, e.enqueued, e.job.id)

        no_borrowing = ""
        starving: Entry | None = None  # a job past the bound, waiting for slots: it holds a reservation
        for e in sorted(waiting, key=key):
            job = e.job
            if job.group and job.group_limit and in_group.get(job.group, 0) >= job.group_limit:
                # the sweep's own cap: it holds nothing back for anyone else's job
                verdicts[job.id] = (None, f"sweep {job.group} has {job.group_limit} trial(s) running, its parallelism")
                continue
            borrow, why, kind = _room(config, used, job)
            if borrow is not None and borrow > 0 and no_borrowing:
                borrow, why = None, no_borrowing
            if (
                borrow is not None
                and starving is not None
                and (borrow > 0 or job.team == starving.job.team)
                and _would_delay(config, starving.job, job, used, running, now)
            ):
                # what it would take, the starving job needs; other teams still get their own quota
                waited = (now - starving.enqueued) / 60
                borrow, why = None, f"behind {_seen_by_all(starving.job)}, which has waited {waited:.0f} min"
            budget = config.teams[job.team].monthly_budget
            cost = owed(job) if borrow is not None else 0.0  # read only for a job that has the room
            if borrow is not None and spend is not None and budget is not None:
                left = (
                    budget
                    - spend.this_month.get(job.team, 0.0)
                    - spend.reserved.get(job.team, 0.0)
                    - committed[job.team]
                )
                if cost > left:
                    borrow, why = (
                        None,
                        f"team {job.team}'s budget: {max(left, 0):.2f} left, the job may cost {cost:.2f}",
                    )
            if borrow is None:
                verdicts[job.id] = (None, why)
                if kind == FLEET and starving is None and now - e.enqueued >= max_wait:
                    starving = e
                if kind == FLEET and within(job):
                    no_borrowing = f"no borrowing while {_seen_by_all(job)} waits for its team's own quota"
                continue
            verdicts[job.id] = (borrow, "")
            used[job.team] += job.slots
            running.append((now + job.max_hours * 3600, job.slots, job.team))
            in_group[job.group] = in_group.get(job.group, 0) + 1
            committed[job.team] += cost
    return verdicts


class Ledger:
    """The admission state in its store (:mod:`trainyard.scheduling.ledger_db`): a SQLite file shared by the
    task processes of this host, or a PostgreSQL database shared by every host."""

    def __init__(
        self,
        where: str | Path,
        config: ResourcesConfig,
        clock: Callable[[], float] | None = None,
        host: str | None = None,
    ) -> None:
        """``where``: a SQLite file's path or a ``postgresql://`` URL. ``clock``: the time leases are judged
        by; default, the store's (this host's for SQLite, the database server's for PostgreSQL). ``host``:
        the name of this worker host, whose devices it hands out (default: its hostname)."""
        import socket

        self.db, self.config, self.clock = open_db(where), config, clock
        self.host = host or socket.gethostname()

    def _now(self, conn: Connection) -> float:
        return self.clock() if self.clock is not None else self.db.now(conn)

    @staticmethod
    def _entries(conn: Connection) -> list[Entry]:
        rows = conn.execute(
            'SELECT id, team, gpu_type, slots, priority, max_hours, "user", grp, grp_limit, enqueued, admitted, '
            "borrowed, lease_until, devices, host FROM admission"
        ).fetchall()
        return [
            Entry(Job(*r[:9]), r[9], r[10], r[11], r[12], tuple(r[13].split(",")) if r[13] else (), r[14]) for r in rows
        ]

    def _here(self, host: str) -> bool:
        """Whether devices recorded for ``host`` are this host's: on a shared ledger every worker host
        numbers its GPUs from 0, so only its own rows' devices can clash with what it hands out."""
        return host in (self.host, "")

    @staticmethod
    def _drop_lapsed(conn: Connection, now: float) -> None:
        """Rows whose lease ran out go before anything is handed out: their slots and devices are free."""
        conn.execute("DELETE FROM admission WHERE lease_until < ?", (now,))

    def _decide(self, conn: Connection, now: float, spend: Spend | None) -> dict[str, tuple[int | None, str]]:
        """Drop what ran out, admit what the plan admits. A job admitted on another's request keeps its
        waiting lease: if its admit task is gone (a cancelled run), its slots come back within that."""
        self._drop_lapsed(conn, now)
        conn.execute("DELETE FROM arrivals WHERE enqueued < ?", (now - ARRIVAL_KEPT_S,))
        conn.execute("DELETE FROM cancelled WHERE at < ?", (now - ARRIVAL_KEPT_S,))
        config = self.config
        entries = [e for e in self._entries(conn) if e.job.gpu_type in config.gpu_types and e.job.team in config.teams]
        verdicts = plan(config, entries, now, spend)
        for job_id, (borrow, _) in verdicts.items():
            if borrow is not None:
                conn.execute("UPDATE admission SET admitted = ?, borrowed = ? WHERE id = ?", (now, borrow, job_id))
        return verdicts

    def request(self, job: Job, spend: Spend | None = None) -> Decision:
        """Queue ``job`` or renew its place, and decide: whether it is admitted now, or why it waits. Its
        arrival is its first request's, kept apart from the lease: a job that missed a look, or whose
        training is retried, keeps its place. ``spend``: for the budget gate
        (:func:`trainyard.scheduling.budgets.current_spend`); None leaves budgets out."""
        with self.db.transaction() as conn:
            now = self._now(conn)
            gone = conn.execute("SELECT reason FROM cancelled WHERE id = ?", (job.id,)).fetchone()
            if gone is not None:  # a look already under way when it was cancelled must not queue it again
                return Decision(False, gone[0], cancelled=True)
            unknown = inadmissible_reason(self.config, job)
            if unknown is not None:  # never "waiting" for a team or type that is gone: say so, queue nothing
                conn.execute("DELETE FROM admission WHERE id = ? AND admitted IS NULL", (job.id,))
                return Decision(False, unknown, inadmissible=True)
            conn.execute("INSERT INTO arrivals (id, enqueued) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", (job.id, now))
            (arrived,) = conn.execute("SELECT enqueued FROM arrivals WHERE id = ?", (job.id,)).fetchone()
            conn.execute(
                'INSERT INTO admission (id, team, gpu_type, slots, priority, max_hours, "user", grp, grp_limit, '
                "enqueued, lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "lease_until = CASE WHEN excluded.lease_until > admission.lease_until "
                "THEN excluded.lease_until ELSE admission.lease_until END",
                (
                    job.id,
                    job.team,
                    job.gpu_type,
                    job.slots,
                    job.priority,
                    job.max_hours,
                    job.user,
                    job.group,
                    job.group_limit,
                    arrived,
                    now + WAITING_LEASE_S,
                ),
            )
            verdicts = self._decide(conn, now, spend)
            row = conn.execute("SELECT admitted, borrowed FROM admission WHERE id = ?", (job.id,)).fetchone()
            if row[0] is not None:  # its training has until then to start and take over the lease
                until = now + ADMITTED_LEASE_S
                conn.execute(
                    "UPDATE admission SET lease_until = CASE WHEN lease_until > ? THEN lease_until ELSE ? END "
                    "WHERE id = ?",
                    (until, until, job.id),
                )
        if row[0] is not None:
            borrowed = f", {row[1]} of them borrowed" if row[1] else ""
            return Decision(True, f"admitted: {job.slots} {job.gpu_type} slot(s) for team {job.team}{borrowed}")
        return Decision(False, verdicts.get(job.id, (None, "waiting"))[1])

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
        admitted within them and is running."""
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
            if job.gpu_type not in self.config.gpu_types or job.team not in self.config.teams:
                return False
            # counted from the rows themselves: one may be of a team this process's config does not know yet
            of_type = [e.job for e in live if e.job.gpu_type == job.gpu_type]
            if sum(j.slots for j in of_type) + job.slots > self.config.gpu_types[job.gpu_type].slots:
                return False
            if set(devices) & {d for e in live if self._here(e.host) for d in e.devices}:
                return False
            (arrived,) = conn.execute(
                "SELECT coalesce(min(enqueued), ?) FROM arrivals WHERE id = ?", (now, job.id)
            ).fetchone()
            team_used = sum(j.slots for j in of_type if j.team == job.team)
            borrowed = max(0, team_used + job.slots - max(self.config.quota(job.team, job.gpu_type), team_used))
            conn.execute(
                'INSERT INTO admission (id, team, gpu_type, slots, priority, max_hours, "user", grp, grp_limit, '
                "enqueued, admitted, borrowed, devices, host, lease_until) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job.id, job.team, job.gpu_type, job.slots, job.priority, job.max_hours, job.user, job.group,
                 job.group_limit, arrived, now, borrowed, ",".join(devices), self.host, now + RUNNING_LEASE_S),
            )  # fmt: skip
            return True

    def release(self, job_id: str) -> None:
        """The job is done (its training ended for good, or it gave up waiting): its slots and its place
        go; the next look of a waiting job takes them."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM admission WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM arrivals WHERE id = ?", (job_id,))

    def cancel(self, job_id: str, reason: str) -> None:
        """Take the job out of the queue for good (``trainyard queue cancel``): its row, slots and place go,
        and no later look or heartbeat of its tasks, already under way, can bring it back (its training, if
        it runs, stops at its next heartbeat)."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM admission WHERE id = ?", (job_id,))
            conn.execute("DELETE FROM arrivals WHERE id = ?", (job_id,))
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

    def claim_devices(self, job_id: str, count: int, available: list[str]) -> list[str]:
        """``count`` of this host's devices (``available``: CUDA indices or MIG UUIDs) for an admitted job,
        none of them held by another live job; the same ones again for a job that has them (a retry). They
        go with the job's admission row, so they come back when it is released or its lease runs out.
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
            if row[0] and self._here(row[1]):  # a retry on the same host: the same ones
                return row[0].split(",")
            # (a retry on another host claims this host's devices anew)
            held = {
                d
                for (devices, host) in conn.execute(
                    "SELECT devices, host FROM admission WHERE id != ? AND lease_until >= ? AND devices != ''",
                    (job_id, now),
                ).fetchall()
                if self._here(host)
                for d in devices.split(",")
            }
            free = [d for d in available if d not in held]
            if len(free) < count:
                raise NoFreeDevices(
                    f"job {job_id} needs {count} device(s); this host has {len(available)}, "
                    f"{len(free)} free ({sorted(held)} held by other jobs)"
                )
            conn.execute(
                "UPDATE admission SET devices = ?, host = ? WHERE id = ?", (",".join(free[:count]), self.host, job_id)
            )
            return free[:count]

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

    def standing(self, spend: Spend | None = None) -> list[tuple[Entry, str]]:
        """Every live job with what the ledger says of it now, without changing anything: an admitted
        job's share, or why a waiting one waits, in the words its ``admit`` task logs (the same
        :func:`plan`). Admitted jobs first, then the waiting, each oldest first."""
        with self.db.connection() as conn:
            now = self._now(conn)
            entries = [e for e in self._entries(conn) if e.lease_until >= now]
        known = [e for e in entries if e.job.gpu_type in self.config.gpu_types and e.job.team in self.config.teams]
        verdicts = plan(self.config, known, now, spend)
        rows = []
        for e in sorted(entries, key=lambda e: (e.admitted is None, e.enqueued)):
            if e.admitted is not None:
                borrowed = f", {e.borrowed} of them borrowed" if e.borrowed else ""
                rows.append((e, f"admitted: {e.job.slots} {e.job.gpu_type} slot(s) for team {e.job.team}{borrowed}"))
            elif e not in known:
                rows.append((e, inadmissible_reason(self.config, e.job) or ""))
            else:
                borrow, why = verdicts[e.job.id]
                rows.append((e, why if borrow is None else "fits now: admitted at its next look"))
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


def existing_ledger(config: ResourcesConfig | None = None) -> Ledger | None:
    """This installation's ledger, over ``config`` or the resources in force, if a job was ever queued in
    it, else None: for reports and checks, which must not create a SQLite file (and work without
    TRAINYARD_HOME). A PostgreSQL ledger is always there."""
    from trainyard.scheduling.resources import resources_in_force

    where = ledger_location()
    if isinstance(where, Path) and not where.is_file():
        return None
    return Ledger(where, config or resources_in_force())


def look(ledger: Ledger, job: Job) -> Decision:
    """One look of a waiting job: its request, with this month's spend of every team for the budget gate."""
    from trainyard import paths
    from trainyard.scheduling.budgets import current_spend, fill_journal

    try:
        fill_journal(ledger.config, paths.runs_root())  # once per installation: then a no-op
    except OSError as err:  # the spend is read from the usage files meanwhile: the queue goes on
        logging.getLogger(__name__).warning("could not fill the spend journal (%s); looking without it", err)
    return ledger.request(job, current_spend(ledger.config, paths.runs_root()))


def job_for(res: Resources, run_key: str, user: str | None = None, group: str = "", group_limit: int = 0) -> Job:
    """The ledger's view of a run's JobSpec (its ``resources``), triggered by ``user``; a sweep's trial is
    one of ``group``, of which at most ``group_limit`` are admitted at once."""
    return Job(
        run_key, res.team, res.gpu_type, res.total_gpus, res.priority, res.max_hours, user or "", group, group_limit
    )


class NotAdmitted(RuntimeError):
    """The job's reservation ran out before its training started, and it cannot be admitted again now."""


class AdmissionLost(RetryableError):
    """The job's lease ran out while it trained and its slots went to another job: its training was
    stopped (never two jobs on one GPU). A retry resumes from its newest checkpoint once admitted again."""


class NoFreeDevices(NotAdmitted):
    """The job is admitted, but fewer of this host's devices are free than it needs (for now)."""


def host_devices() -> list[str]:
    """This host's GPUs as the allocator hands them out: ``TRAINYARD_GPU_DEVICES`` (a comma list of CUDA
    indices or MIG UUIDs) when set, else every CUDA device torch sees."""
    import os

    listed = os.environ.get("TRAINYARD_GPU_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@dataclass
class Lease:
    """What :func:`hold` gives the training: the devices it may use and the signal to stop."""

    devices: list[str] | None  # this host's GPUs the job was given (CUDA_VISIBLE_DEVICES); None: a CPU job
    lost: threading.Event  # set when the lease ran out and its slots could not be taken back: stop training
    waited_s: float | None = None  # from the job's arrival in the queue to its admission


@contextlib.contextmanager
def hold(
    ledger: Ledger,
    job: Job,
    *,
    final_try: bool = False,
    available: list[str] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    spend: Spend | None = None,
) -> Iterator[Lease]:
    """Around a job's training: its admission, renewed every ``heartbeat_s`` by a thread, and with
    ``available`` (this host's GPUs) ``slots`` of them for the job (:meth:`Ledger.claim_devices`).

    Released (slots, devices and place in the queue) once the training can no longer run: it succeeded,
    failed for good (a permanent error, :func:`trainyard.errors.is_permanent`) or failed on its
    ``final_try``. After another failure it is kept for ``ADMITTED_LEASE_S``, for the retry to find. An
    admission that ran out before the training (a retry long after its try) is asked for again;
    NotAdmitted if it cannot be had now (the task waits and tries again). A lease that runs out while the
    job trains is taken back (:meth:`Ledger.reclaim`); where another job has its slots by then,
    ``Lease.lost`` is set for the launcher to stop the workers, and the training ends in AdmissionLost."""
    log = logging.getLogger(__name__)
    if not ledger.renew(job.id):
        decision = ledger.request(job, spend)
        if decision.final:  # taken out of the queue, or its team or type gone: no retry brings it back
            raise PermanentError(f"job {job.id}: {decision.reason}")
        if not decision.admitted:
            raise NotAdmitted(f"job {job.id} is not admitted any more: {decision.reason}")
        ledger.renew(job.id)
    try:
        devices = None if available is None else ledger.claim_devices(job.id, job.slots, available)
    except PermanentError:  # more devices than the host has: this job can never run here
        ledger.release(job.id)
        raise
    entry = next((e for e in ledger.entries() if e.job.id == job.id), None)
    waited = None if entry is None or entry.admitted is None else max(entry.admitted - entry.enqueued, 0.0)
    lease = Lease(devices, threading.Event(), waited)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            try:
                if ledger.renew(job.id):
                    continue
                if ledger.reclaim(job, tuple(devices or ())):
                    log.warning("admission of %s ran out while it trained; it took its slots back", job.id)
                    continue
                why = ledger.cancelled(job.id) or "its lease ran out while it trained and its slots went to another job"
                log.error("admission of %s: %s; stopping its workers", job.id, why)
                lease.lost.set()
                return
            except Exception as err:  # noqa: BLE001 - retried at the next beat; the thread must not die
                log.warning("admission heartbeat of %s failed: %s: %s", job.id, type(err).__name__, err)

    thread = threading.Thread(target=beat, name="trainyard-admission-heartbeat", daemon=True)
    thread.start()

    def lost() -> Exception:
        cancelled = ledger.cancelled(job.id)
        if cancelled:  # taken out of the queue: no retry
            return PermanentError(f"job {job.id}: {cancelled}; its workers were stopped")
        return AdmissionLost(
            f"job {job.id}: its admission ran out while it trained and its slots went to another job, so its "
            "workers were stopped; a retry waits for admission and resumes from the newest checkpoint"
        )

    for_good = True
    try:
        yield lease
        if lease.lost.is_set():  # workers that exit 0 when stopped leave a partial result: not a success
            raise lost()
    except (AdmissionLost, PermanentError) as err:  # the lease lost after a clean body, or a cancel
        for_good = final_try or is_permanent(err)
        raise
    except Exception as err:
        for_good = final_try or is_permanent(err)
        if lease.lost.is_set() and not is_permanent(err):
            ending = lost()
            for_good = final_try or is_permanent(ending)
            raise ending from err
        raise
    except BaseException:  # the task was terminated (marked failed, timed out): Airflow decides what comes next
        for_good = final_try
        raise
    finally:
        stop.set()
        thread.join()
        try:
            if for_good:
                ledger.release(job.id)
            else:
                ledger.renew(job.id, ADMITTED_LEASE_S)
        except DatabaseUnavailable as err:  # the lease runs out by itself; the training's own outcome stands
            log.warning("could not hand back the admission of %s: %s", job.id, err)
