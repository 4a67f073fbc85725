"""When a waiting job starts: the policy (:mod:`.policy`) run forward from the jobs running and waiting.

Three answers:

* **the latest start** (:attr:`StartEstimate.latest`): the policy run forward as every admitted job runs to
  its ``max_hours``: a bound users can plan by, if no job arrives that passes theirs;
* **the expected start** (:attr:`StartEstimate.expected`): the policy run forward as every job holds its
  slots as long as its team's recent jobs held theirs, as a share of their ``max_hours`` (the median; a
  running job that has held its slots for a while is judged by the jobs that held theirs longer). Without
  that history (fewer than :data:`MIN_HISTORY` finished jobs, its team's or the fleet's) there is only
  the bound;
* **the band** (:attr:`StartEstimate.early`, ``late``) the start falls in, about nine times in ten: the expected
  wait scaled by the quantiles of how the real waits of the last jobs compared with the waits they were
  told (split conformal prediction, on the ledger's own record: :data:`BAND`). What no forward run knows,
  jobs that arrive later and pass (a higher priority, or within their quota) and how far off a user's
  ``max_hours`` is, is in that record. Without enough of it (:data:`MIN_TOLD`) there is no band.

Kueue gives a position only ("we don't have the means to estimate wait time", kueue#13159); trainyard has
every job's ``max_hours``, its slots and the policy, and its ledger keeps how long jobs held their slots and
how their waits came out. How good the estimate is, on replayed traces: BENCHMARKS.md ("Start estimates";
``bench/scheduler.py --policy-only ... --start-estimates``).

The forward run preempts nobody (a job already preempting starts once its victims have stopped, within the
grace), and places the waiting jobs the policy admits now and the first :data:`WAITING_IN_SIGHT` others of
each GPU type in its order: its cost grows with the square of the jobs it places. A job further back is
told so, and the starts of those placed assume that none of those further back passes them.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainyard.scheduling.admission.policy import Entry, Job, WaitReason, plan
from trainyard.scheduling.resources import ResourcesConfig

if TYPE_CHECKING:
    from trainyard.scheduling.budgets import Spend

# The waiting jobs of a GPU type that the forward runs place, the first in the policy's order (and any it
# admits now): with 3 types, 300 waiting jobs placed twice (the bound, the expected) in 0.25 CPU-s with
# 10,000 waiting (bench/admission_scale.py). A job further back is given no start ("more than 100 jobs ...").
WAITING_IN_SIGHT = 100
MIN_HISTORY = 5  # finished jobs of a team before its own shares are used (else the fleet's)
MIN_TOLD = 20  # jobs whose told and real waits are known, before a band is given
BAND = (0.05, 0.95)  # the quantiles of real wait / told wait that bound the band: about 9 starts in 10
WAIT_FLOOR_S = 60.0  # added to both waits of a ratio (a look's period): a wait of "now" has a ratio too
HISTORY_KEPT_S = 30 * 24 * 3600.0  # how long the ledger keeps a finished job's hold and a wait's ratio
HISTORY_READ = 1000  # the most recent holds (and ratios) read for an estimate: its cost does not grow with history
ALL_TEAMS = ""  # History's key for every team's shares together


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of a non-empty sorted list, interpolated between its neighbours."""
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


class History:
    """What the ledger remembers for the estimates (:meth:`~.ledger.Ledger.history`): how long recent
    finished jobs held their slots, each as a share of its ``max_hours`` (0 to 1), per team and for the whole
    fleet; and how recent jobs' real waits compared with the waits they were told (:func:`wait_ratio`)."""

    def __init__(self, shares: Mapping[str, Iterable[float]], ratios: Iterable[float] = ()) -> None:
        self.shares = {team: sorted(min(1.0, max(0.0, s)) for s in of_team) for team, of_team in shares.items()}
        self.shares[ALL_TEAMS] = sorted(
            s for team, of_team in self.shares.items() if team != ALL_TEAMS for s in of_team
        )
        self.ratios = sorted(ratios)

    @classmethod
    def of(cls, holds: Iterable[tuple[str, float]], ratios: Iterable[float] = ()) -> History:
        """From (team, share) rows and wait ratios."""
        by_team: dict[str, list[float]] = {}
        for team, share in holds:
            by_team.setdefault(team, []).append(share)
        return cls(by_team, ratios)

    def known(self, team: str) -> bool:
        return len(self._pool(team)) >= MIN_HISTORY

    def _pool(self, team: str) -> list[float]:
        own = self.shares.get(team, [])
        return own if len(own) >= MIN_HISTORY else self.shares[ALL_TEAMS]

    def hold_s(self, job: Job, ran_s: float, q: float = 0.5) -> float:
        """How long ``job`` holds its slots in all, having held them ``ran_s`` so far: the ``q`` quantile of
        the shares of its team's jobs that held theirs longer than that, times its ``max_hours``; its whole
        ``max_hours`` where none did (or there is no history); ``ran_s`` where it is past its ``max_hours``."""
        limit = job.max_hours * 3600
        pool = self._pool(job.team) if self.known(job.team) else []
        longer = pool[bisect.bisect_right(pool, ran_s / limit) :] if limit > 0 else []
        return max(ran_s, _quantile(longer, q) * limit if longer else limit)

    def band(self, told_wait_s: float, floor_s: float = WAIT_FLOOR_S) -> tuple[float, float] | None:
        """The waits (seconds) that a wait told as ``told_wait_s`` falls between, about 9 times in 10 by the
        record (:data:`BAND`); None without enough of it (:data:`MIN_TOLD`)."""
        n = len(self.ratios)
        if n < MIN_TOLD:
            return None
        # split conformal prediction's ranks: the floor((n+1) lo)-th and the ceil((n+1) hi)-th of n ratios
        lo, hi = max(math.floor((n + 1) * BAND[0]), 1) - 1, min(math.ceil((n + 1) * BAND[1]), n) - 1
        told = told_wait_s + floor_s
        return max(0.0, told * self.ratios[lo] - floor_s), max(0.0, told * self.ratios[hi] - floor_s)


def wait_ratio(told_wait_s: float, real_wait_s: float, floor_s: float = WAIT_FLOOR_S) -> float:
    """How a real wait came out against the wait told, the record :meth:`History.band` reads."""
    return (max(0.0, real_wait_s) + floor_s) / (max(0.0, told_wait_s) + floor_s)


NO_HISTORY = History({})


@dataclass(frozen=True)
class StartEstimate:
    """When a waiting job starts (epoch seconds): ``latest`` if every admitted job runs to its max_hours
    (None: never, in that future); ``expected`` from how long recent jobs held their slots (None without
    that history), and the band (``early``, ``late``) it falls in about 9 times in 10 (None without a
    record); ``behind``: too far back in its queue to be run forward (then all None)."""

    latest: float | None
    expected: float | None = None
    early: float | None = None
    late: float | None = None
    behind: bool = False  # more than WAITING_IN_SIGHT jobs of its type wait before it: none estimated


def _forward(
    config: ResourcesConfig, sight: list[Entry], now: float, hold_s: Callable[[Job, float], float]
) -> dict[str, float]:
    """When each waiting job of ``sight`` (:func:`_in_sight`) starts if no other job arrives and each holds
    its slots for ``hold_s(job, held so far)``: the policy run forward, each admitted job's end (and each
    waiting job's passing of the wait bound) a new decision, admitting what it admits then. A job the
    policy never admits in that future (a limit) has none. Each GPU type is run forward on its own: no rule
    but the budget's (left to the first decision, :func:`_in_sight`) joins two types (a sweep's trials
    share one), and a decision's cost grows with the jobs it looks at."""
    grace = config.scheduling.preemption.grace_seconds
    ends = {
        e.job.id: now + grace if e.preempted_for else e.admitted + hold_s(e.job, max(0.0, now - e.admitted))
        for e in sight
        if e.admitted is not None
    }
    starts: dict[str, float] = {}
    for gpu_type in config.slot_types:
        of_type = [e for e in sight if e.job.gpu_type == gpu_type]
        if any(e.admitted is None for e in of_type):
            starts.update(_forward_type(config, of_type, now, hold_s, ends))
    return starts


def _forward_type(
    config: ResourcesConfig,
    live: list[Entry],
    now: float,
    hold_s: Callable[[Job, float], float],
    ends: dict[str, float],
) -> dict[str, float]:
    """:func:`_forward` for the entries of one GPU type; ``ends``: when each admitted one ends, which this
    adds to."""
    capacity = config.slot_types[live[0].job.gpu_type].slots
    max_wait = config.scheduling.max_wait_minutes * 60
    starts: dict[str, float] = {}
    at = now
    while True:
        waiting = [e for e in live if e.admitted is None]
        free = capacity - sum(e.job.slots for e in live if e.admitted is not None)
        if free >= min(e.job.slots for e in waiting):  # else no decision can admit anything: the next end
            verdicts = plan(config, live, at, admissions_only=True)
            live = [
                dataclasses.replace(e, admitted=at, borrowed=verdicts[e.job.id].borrowed)
                if e.admitted is None and e.job.id in verdicts and verdicts[e.job.id].admitted
                else e
                for e in live
            ]
            for e in live:
                if e.admitted == at and e.job.id not in ends:
                    starts[e.job.id], ends[e.job.id] = at, at + hold_s(e.job, 0.0)
        running = [e for e in live if e.admitted is not None]
        if not running or all(e.admitted is not None for e in live):
            return starts  # every job placed, or nothing left to free a slot: what still waits, waits for another
        # the next end, or the next waiting job past the wait bound (it goes first and holds a reservation)
        bound = [e.waiting_from + max_wait for e in live if e.admitted is None and e.waiting_from + max_wait > at]
        at = max(at, min([ends[e.job.id] for e in running] + bound))
        live = [e for e in live if e.admitted is None or ends[e.job.id] > at]


def _in_sight(
    config: ResourcesConfig,
    entries: list[Entry],
    now: float,
    spend: Spend | None,
    served: Mapping[str, Sequence[float]] | None = None,
) -> tuple[list[Entry], set[str]]:
    """What the forward runs place, and the waiting jobs too far back in their queues to be placed: of the
    teams and GPU types of ``config``, the admitted, and of each type's waiting jobs every one the policy
    admits now and the first :data:`WAITING_IN_SIGHT` of the others in its order. A job its team's budget
    holds back now (``spend``), or that no live worker can run (``served``, :func:`.policy.unserved`), is in
    neither: it has no start from the fleet's side alone."""
    live = [e for e in entries if e.job.gpu_type in config.slot_types and e.job.team in config.teams]
    by_id = {e.job.id: e for e in live}
    sight = [e for e in live if e.admitted is not None]
    seen: dict[str, int] = {}
    behind: set[str] = set()
    for job_id, verdict in plan(config, live, now, spend, served=served).items():  # each type's, in its order
        e = by_id[job_id]
        if verdict.reason in (WaitReason.BUDGET, WaitReason.UNSERVED):
            continue
        if verdict.admitted or seen.get(e.job.gpu_type, 0) < WAITING_IN_SIGHT:
            seen[e.job.gpu_type] = seen.get(e.job.gpu_type, 0) + (not verdict.admitted)
            sight.append(e)
        else:
            behind.add(job_id)
    return sight, behind


def latest_starts(
    config: ResourcesConfig, entries: list[Entry], now: float, spend: Spend | None = None
) -> dict[str, float]:
    """By when each waiting job starts at the latest, if no other job arrives and every admitted job runs to
    its ``max_hours`` (one past it counts as ending now). A bound users can plan by, not a forecast: jobs that
    end early start the others sooner, a job arriving later with a higher priority, or within its quota, may
    pass, and ``max_hours`` bounds a training's time, not its wall time (a retry's wait is not in it)."""
    return _forward(config, _in_sight(config, entries, now, spend)[0], now, _bound)


def _bound(job: Job, ran_s: float) -> float:
    return max(ran_s, job.max_hours * 3600)


def estimate_starts(
    config: ResourcesConfig,
    entries: list[Entry],
    now: float,
    spend: Spend | None = None,
    history: History = NO_HISTORY,
    floor_s: float = WAIT_FLOOR_S,
    served: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, StartEstimate]:
    """Each waiting job's :class:`StartEstimate` (none for a job no forward run starts: a limit or its budget
    holds it): the latest start, and with ``history`` (the ledger's) the expected start and its band.
    ``floor_s``: :func:`wait_ratio`'s, for a record kept at another time scale (the replay's). ``served``:
    the types the live workers serve (:meth:`~.ledger.Ledger.served`)."""
    sight, behind = _in_sight(config, entries, now, spend, served)
    latest = _forward(config, sight, now, _bound)
    waiting = [e.job for e in sight if e.admitted is None]
    known = [job for job in waiting if history.known(job.team)]
    expected = _forward(config, sight, now, history.hold_s) if known else {}
    found = {job.id: StartEstimate(latest[job.id]) for job in waiting if job.id in latest}
    found.update({job_id: StartEstimate(None, behind=True) for job_id in behind})
    for job in known:
        if job.id in expected:
            x = expected[job.id]
            band = history.band(x - now, floor_s)
            # the band holds the expected start (its ratios' median need not be 1)
            early, late = (None, None) if band is None else (min(now + band[0], x), max(now + band[1], x))
            found[job.id] = StartEstimate(latest.get(job.id), x, early, late)
    return found


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def start_in_words(estimate: StartEstimate | None, now: float) -> str:
    """A waiting job's start (:func:`estimate_starts`; None: none in sight) in words."""
    if estimate is None:
        return "no start in sight (a limit or its team's budget holds it back)"
    if estimate.behind:
        return f"more than {WAITING_IN_SIGHT} jobs of its GPU type wait before it: no start estimated yet"
    if estimate.latest is not None and estimate.latest <= now + 60:
        return "starts at its next look"
    bound = (
        f"starts by {_clock(estimate.latest)} if the running jobs end by their max_hours and no later job passes it"
        if estimate.latest is not None
        else "no start in sight if the running jobs use their max_hours"
    )
    if estimate.expected is None:
        return bound
    said = (
        "expected to start within a minute"
        if estimate.expected <= now + 60
        else f"expected to start about {_clock(estimate.expected)}"
    )
    if estimate.early is not None and estimate.late is not None:
        day = _clock(estimate.expected).split(" ")[0]
        early, late = (_clock(t).removeprefix(day + " ") for t in (estimate.early, estimate.late))
        said += f" (about 9 in 10 start between {early} and {late}, by how recent waits came out)"
    return f"{said}; {bound}"
