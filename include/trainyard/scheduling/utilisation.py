"""What the fleet was used for, from Airflow's own task records: utilisation per GPU pool and per team,
queue waits by job size, borrowed GPU-seconds, and any moment over capacity or over a team's limits.

Definitions (``trainyard report utilisation`` prints them with the figures):

* **allocated**: a training task's ``pool_slots`` from its start to its end, every try (a task holds its
  slots while it runs or, in a pool that counts deferred tasks, while it waits deferred on a cluster);
* **utilisation** of a pool: allocated slot-seconds / (slots x the window); of the fleet: the same summed
  over the pools asked for. This is allocation, what Kueue's usage metrics report, not GPU activity (SM
  occupancy belongs to a GPU run's own profile);
* **wait** of a job: from the start of its ``admit`` task (the job asks for its GPUs) to the start of its
  training's first try; without an admit task (Kubernetes trainings queue in the pool and then on the
  cluster), from the training task's first queueing. A job still waiting at the window's end counts with
  its wait so far;
* **borrowed**: at each moment, what a team holds of a type beyond its quota, integrated over the window;
* **violation**: a type's allocations above its slots, or a team's above its quota plus its borrowing
  limit, for more than ``HANDOVER_S`` (5 s) at a stretch: a job hands its slots to the ledger as its
  training ends, a moment before Airflow stamps the task's end, so the next job's record may overlap the
  last one's by about a second. A third kind: the teams above their quota holding more than the others'
  lending limits allow (a team's reserve taken).

Pure functions over :class:`Allocation` records; :func:`allocations_from_airflow` reads them from the
Airflow database (``task_instance`` and ``task_instance_history``, joined to the run's conf for the team).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.scheduling.resources import POOL_PREFIX, ResourcesConfig

if TYPE_CHECKING:
    from trainyard.scheduling.admission.ledger import Stint

# a training try in one of these states held nothing (a skipped branch, a cancelled or failed run); a
# skipped one still has a start (the moment it was skipped)
DROPPED = ("skipped", "upstream_failed", "removed")
# the latest try in one of these has not started (its row may still carry the previous try's dates)
NOT_STARTED = ("scheduled", "queued", "up_for_retry", "up_for_reschedule", "restarting")
# A job hands its slots back to the ledger as its training ends, a moment before Airflow writes the task's
# end: the next job may start in that moment, so two records overlap by about a second. A limit exceeded
# for longer than this at a stretch is a violation.
HANDOVER_S = 5.0
SIZE_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, 4, "3-4"), (5, 8, "5-8"), (9, 10**9, "9+"))


@dataclass(frozen=True)
class Allocation:
    """One try of a job's training: ``slots`` of ``gpu_type`` held from ``start`` to ``end`` (epoch seconds).
    ``start`` None: the job asked at ``asked`` and has not started yet; ``end`` None: it still holds them."""

    run: str  # "<dag_id>/<run_id>"
    team: str
    gpu_type: str
    slots: int
    start: float | None
    end: float | None
    asked: float | None = None  # when the job began to wait for its GPUs (only on its first try's record)
    first_try: bool = True


@dataclass
class PoolUse:
    slots: int
    allocated_s: float = 0.0
    borrowed_s: float = 0.0
    capacity_s: float = 0.0

    @property
    def utilisation(self) -> float:
        return self.allocated_s / self.capacity_s if self.capacity_s else 0.0


@dataclass
class Waits:
    jobs: int
    p50_s: float
    p95_s: float
    max_s: float


@dataclass
class Report:
    since: float
    until: float
    pools: dict[str, PoolUse]
    teams: dict[str, dict[str, float]]  # team -> {"allocated_s", "borrowed_s", "share"}
    waits: dict[str, Waits]  # size bucket -> waits of the jobs that started (or still wait) in the window
    longest_wait: tuple[str, int, float] | None  # (run, slots, seconds)
    waiting: int  # jobs still waiting at the window's end
    violations: list[str] = field(default_factory=list)

    @property
    def fleet(self) -> PoolUse:
        total = PoolUse(slots=sum(p.slots for p in self.pools.values()))
        for p in self.pools.values():
            total.allocated_s += p.allocated_s
            total.borrowed_s += p.borrowed_s
            total.capacity_s += p.capacity_s
        return total

    def as_dict(self) -> dict:
        fleet = self.fleet
        return {
            "since": self.since,
            "until": self.until,
            "utilisation": round(fleet.utilisation, 4),
            "allocated_gpu_s": round(fleet.allocated_s, 1),
            "borrowed_gpu_s": round(fleet.borrowed_s, 1),
            "pools": {
                name: {
                    "slots": p.slots,
                    "utilisation": round(p.utilisation, 4),
                    "allocated_gpu_s": round(p.allocated_s, 1),
                    "borrowed_gpu_s": round(p.borrowed_s, 1),
                }
                for name, p in self.pools.items()
            },
            "teams": {t: {k: round(v, 4) for k, v in d.items()} for t, d in self.teams.items()},
            "waits": {b: vars(w) for b, w in self.waits.items()},
            "longest_wait": (
                None
                if self.longest_wait is None
                else {"run": self.longest_wait[0], "slots": self.longest_wait[1], "seconds": self.longest_wait[2]}
            ),
            "waiting": self.waiting,
            "violations": self.violations,
        }


def _clip(a: Allocation, since: float, until: float) -> tuple[float, float] | None:
    if a.start is None:
        return None
    lo, hi = max(a.start, since), min(until if a.end is None else a.end, until)
    return (lo, hi) if hi > lo else None


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def size_bucket(slots: int) -> str:
    return next(name for lo, hi, name in SIZE_BUCKETS if lo <= slots <= hi)


def _steps(spans: Iterable[tuple[float, float, int]]) -> list[tuple[float, int]]:
    """(time, level after it) of the sum of ``spans`` (start, end, amount)."""
    deltas: dict[float, int] = defaultdict(int)
    for lo, hi, amount in spans:
        deltas[lo] += amount
        deltas[hi] -= amount
    level, out = 0, []
    for t in sorted(deltas):
        level += deltas[t]
        out.append((t, level))
    return out


def _above(steps: list[tuple[float, int]], limit: int) -> tuple[float, int, float | None, float]:
    """Seconds-times-amount above ``limit``, the highest level, when it was first exceeded, and the
    longest stretch of time it stayed exceeded."""
    area, peak, first, longest, since = 0.0, 0, None, 0.0, None
    for (t, level), (t_next, _) in zip(steps, steps[1:], strict=False):
        peak = max(peak, level)
        if level > limit:
            area += (level - limit) * (t_next - t)
            first = t if first is None else first
            since = t if since is None else since
            longest = max(longest, t_next - since)
        else:
            since = None
    return area, peak, first, longest


def _lent_beyond_limits(
    config: ResourcesConfig, gpu_type: str, spans: dict[str, list[tuple[float, float, int]]], tolerance: float
) -> list[str]:
    """The longest stretch in which the teams above their quota of ``gpu_type`` held more than the others
    could lend (``ResourcesConfig.lent``), if it is longer than ``tolerance``."""
    known = {team: ss for team, ss in spans.items() if team in config.teams}
    if not known:
        return []
    deltas: dict[float, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for team, ss in known.items():
        for lo, hi, amount in ss:
            deltas[lo][team] += amount
            deltas[hi][team] -= amount
    used = dict.fromkeys(config.teams, 0)
    since: float | None = None
    worst: tuple[float, float] | None = None  # (the longest stretch, its start)
    for t in sorted(deltas):
        for team, change in deltas[t].items():
            used[team] += change
        borrowed, lendable = config.lent(gpu_type, used)
        if borrowed > lendable:
            since = t if since is None else since
        elif since is not None:
            if worst is None or t - since > worst[0]:
                worst = (t - since, since)
            since = None
    if worst is None or worst[0] <= tolerance:
        return []
    return [
        f"{gpu_type}: teams above their quota held more than the others' lending limits allow "
        f"(for {worst[0]:.1f} s at most; first at {worst[1]:.0f})"
    ]


def check_types(config: ResourcesConfig, gpu_types: Sequence[str] | None) -> list[str]:
    """The GPU types of the fleet figure: ``gpu_types`` (each must be in the file), or every type."""
    types = list(gpu_types or config.slot_types)
    unknown = [t for t in types if t not in config.slot_types]
    if unknown:
        raise ValueError(f"GPU types {unknown} are not in the resources file; it has {sorted(config.slot_types)}")
    return types


def _team_borrowing(
    config: ResourcesConfig, team: str, gpu_type: str, spans: list[tuple[float, float, int]], tolerance: float
) -> tuple[float, list[str]]:
    """Slot-seconds ``team`` held of ``gpu_type`` beyond its quota, and its borrowing limit's violations (a team
    the file no longer has: no quota, no limits to hold it to)."""
    steps = _steps(spans)
    known = team in config.teams
    quota = config.quota(team, gpu_type) if known else 0
    borrowed, _, _, _ = _above(steps, quota)
    limit = config.borrowing_limit(team, gpu_type) if known else None
    if limit is None:
        return borrowed, []
    _, peak, first, stretch = _above(steps, quota + limit)
    if first is None or stretch <= tolerance:
        return borrowed, []
    return borrowed, [
        f"{gpu_type}: team {team} held {peak} slots, its quota {quota} + borrowing limit {limit} "
        f"(for {stretch:.1f} s at most; first at {first:.0f})"
    ]


def report(
    config: ResourcesConfig,
    allocations: Sequence[Allocation],
    since: float,
    until: float,
    gpu_types: Sequence[str] | None = None,
    tolerance: float = HANDOVER_S,
) -> Report:
    """The window's utilisation per pool (``gpu_types``: those in the fleet figure, default every type in
    the file), per team, waits by size, borrowing and violations: a limit exceeded for more than
    ``tolerance`` seconds at a stretch."""
    window = until - since
    if window <= 0:
        raise ValueError(f"the window is empty: since {since} is not before until {until}")
    types = check_types(config, gpu_types)
    pools = {
        t: PoolUse(slots=config.slot_types[t].slots, capacity_s=config.slot_types[t].slots * window) for t in types
    }
    teams: dict[str, dict[str, float]] = {}
    spans: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
    for a in allocations:
        clipped = _clip(a, since, until)
        if clipped is None or a.gpu_type not in pools:
            continue
        spans[(a.team, a.gpu_type)].append((*clipped, a.slots))
        pools[a.gpu_type].allocated_s += a.slots * (clipped[1] - clipped[0])
        team = teams.setdefault(a.team, {"allocated_s": 0.0, "borrowed_s": 0.0, "share": 0.0})
        team["allocated_s"] += a.slots * (clipped[1] - clipped[0])
    violations: list[str] = []
    for t, pool in pools.items():
        _, peak, first, stretch = _above(_steps(s for (_, gt), ss in spans.items() if gt == t for s in ss), pool.slots)
        if first is not None and stretch > tolerance:
            violations.append(
                f"{t}: {peak} slots allocated at once, the type has {pool.slots} (for {stretch:.1f} s at most; "
                f"first at {first:.0f})"
            )
    for (team_name, t), team_spans in sorted(spans.items()):
        borrowed, over = _team_borrowing(config, team_name, t, team_spans, tolerance)
        pools[t].borrowed_s += borrowed
        teams[team_name]["borrowed_s"] += borrowed
        violations += over
    for t in pools:
        violations += _lent_beyond_limits(
            config, t, {team: ss for (team, gt), ss in spans.items() if gt == t}, tolerance
        )
    total = sum(p.allocated_s for p in pools.values())
    for team in teams.values():
        team["share"] = team["allocated_s"] / total if total else 0.0
    waits, longest, waiting = _waits(allocations, set(pools), since, until)
    return Report(since, until, pools, dict(sorted(teams.items())), waits, longest, waiting, violations)


def _waits(
    allocations: Sequence[Allocation], gpu_types: set[str], since: float, until: float
) -> tuple[dict[str, Waits], tuple[str, int, float] | None, int]:
    """Queue waits of the jobs first asked for in the window, by job size; the longest (run, slots,
    seconds); how many still wait at its end (their wait so far counts)."""
    by_size: dict[str, list[float]] = defaultdict(list)
    longest: tuple[str, int, float] | None = None
    waiting = 0
    for a in allocations:
        if not a.first_try or a.asked is None or a.gpu_type not in gpu_types:
            continue
        if a.asked > until:
            continue
        if a.start is None or a.start > until:  # still waiting at the window's end: its wait so far
            waiting += 1
            wait = until - a.asked
        elif a.start >= since:
            wait = max(0.0, a.start - a.asked)
        else:
            continue
        by_size[size_bucket(a.slots)].append(wait)
        if longest is None or wait > longest[2]:
            longest = (a.run, a.slots, wait)
    waits = {
        name: Waits(len(w), percentile(w, 50), percentile(w, 95), max(w))
        for _, _, name in SIZE_BUCKETS
        if (w := by_size.get(name))
    }
    return waits, longest, waiting


def timeline(
    allocations: Sequence[Allocation], since: float, until: float, points: int = 240
) -> tuple[list[float], dict[str, list[int]]]:
    """Slots held per team at ``points`` evenly spaced moments of the window (for the chart)."""
    times = [since + (until - since) * i / (points - 1) for i in range(points)]
    held: dict[str, list[int]] = {}
    for a in allocations:
        clipped = _clip(a, since, until)
        if clipped is None:
            continue
        row = held.setdefault(a.team, [0] * points)
        running_at_end = a.end is None or a.end > until
        for i, t in enumerate(times):
            if clipped[0] <= t < clipped[1] or (running_at_end and t == clipped[1]):
                row[i] += a.slots
    return times, dict(sorted(held.items()))


def chart(rep: Report, allocations: Sequence[Allocation], path: Path, title: str = "GPU slots allocated") -> Path:
    """A PNG: slots allocated over the window, stacked by team, against the pools' slots. Drawn with
    matplotlib's object API (no pyplot state), so threads of one process (the api-server's) may draw at once."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chosen = [a for a in allocations if a.gpu_type in rep.pools]
    times, held = timeline(chosen, rep.since, rep.until)
    unit, per = ("hours", 3600) if rep.until - rep.since > 3 * 3600 else ("minutes", 60)  # a day reads in hours
    since_start = [(t - rep.since) / per for t in times]
    fig = Figure(figsize=(9, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if held:
        ax.stackplot(since_start, *held.values(), labels=list(held), alpha=0.85, step="post")
    slots = rep.fleet.slots
    ax.axhline(slots, color="black", linewidth=1, linestyle="--", label=f"capacity ({slots} slots)")
    ax.set_xlabel(f"{unit} since the window's start")
    ax.set_ylabel("slots allocated")
    ax.set_title(f"{title}: {rep.fleet.utilisation:.0%} of {', '.join(rep.pools)}")
    ax.set_ylim(0, slots * 1.08)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def format_report(rep: Report) -> str:
    """The report as text, with the definitions that make the figures mean something."""
    fleet = rep.fleet
    hours = (rep.until - rep.since) / 3600
    lines = [
        f"window: {hours:.2f} h; utilisation = allocated slot-seconds / (slots x window), from the training "
        "tasks' starts and ends in Airflow",
        "",
        f"{'pool':20s} {'slots':>5s} {'utilisation':>11s} {'GPU-h':>9s} {'borrowed GPU-h':>14s}",
    ]
    for name, p in rep.pools.items():
        lines.append(
            f"{POOL_PREFIX + name:20s} {p.slots:5d} {p.utilisation:11.1%} {p.allocated_s / 3600:9.3f} "
            f"{p.borrowed_s / 3600:14.3f}"
        )
    lines.append(
        f"{'fleet':20s} {fleet.slots:5d} {fleet.utilisation:11.1%} {fleet.allocated_s / 3600:9.3f} "
        f"{fleet.borrowed_s / 3600:14.3f}"
    )
    lines += ["", f"{'team':12s} {'GPU-h':>9s} {'share':>7s} {'borrowed GPU-h':>14s}"]
    for team, d in rep.teams.items():
        lines.append(f"{team:12s} {d['allocated_s'] / 3600:9.3f} {d['share']:7.1%} {d['borrowed_s'] / 3600:14.3f}")
    lines += ["", "queue wait (admit start -> training start), by job size in slots:"]
    lines.append(f"{'slots':>6s} {'jobs':>5s} {'p50 s':>8s} {'p95 s':>8s} {'max s':>8s}")
    for bucket, w in rep.waits.items():
        lines.append(f"{bucket:>6s} {w.jobs:5d} {w.p50_s:8.1f} {w.p95_s:8.1f} {w.max_s:8.1f}")
    if rep.longest_wait:
        run, slots, seconds = rep.longest_wait
        lines.append(f"longest wait: {seconds:.1f} s, {run} ({slots} slots)")
    if rep.waiting:
        lines.append(f"still waiting at the window's end: {rep.waiting} job(s) (counted with their wait so far)")
    lines.append("")
    lines.append("violations: none" if not rep.violations else "violations:\n  " + "\n  ".join(rep.violations))
    return "\n".join(lines)


@dataclass(frozen=True)
class TryRow:
    """One row of Airflow's ``task_instance`` (the latest try) or ``task_instance_history`` (earlier tries)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    state: str | None
    pool: str
    pool_slots: int
    start: float | None
    end: float | None
    queued: float | None  # when the scheduler queued it (a training without an admit task waits from here)
    history: bool


def allocations_from_rows(
    rows: Iterable[TryRow], asked: dict[tuple[str, str], float], teams: dict[tuple[str, str], str]
) -> list[Allocation]:
    """One :class:`Allocation` per try of a training task. A try is in the history table once the next one
    is scheduled, and the live row of that next try keeps the old try's dates until it starts: the history
    row counts, and a live row counts as started only in a state that has started. ``asked``: each run's
    admit start; ``teams``: each run's team."""
    tries: dict[tuple, TryRow] = {}
    for r in rows:
        key = (r.dag_id, r.run_id, r.task_id, r.map_index, r.try_number)
        if key not in tries or r.history:
            tries[key] = r
    out = []
    for r in tries.values():
        if r.state in DROPPED:
            continue
        started = r.start is not None and (r.history or r.state not in NOT_STARTED)
        first = r.try_number <= 1  # a retry (or a cleared run's next try) is not a new wait
        if not started and not first:
            continue
        run = (r.dag_id, r.run_id)
        asked_at = asked.get(run, r.queued) if first else None
        if not started and asked_at is None:  # not asking for GPUs yet (its run is still preparing data)
            continue
        out.append(
            Allocation(
                run=f"{r.dag_id}/{r.run_id}",
                team=teams.get(run, ""),
                gpu_type=r.pool[len(POOL_PREFIX) :],
                slots=r.pool_slots,
                start=r.start if started else None,
                end=r.end if started else None,
                asked=asked_at,
                first_try=first,
            )
        )
    return out


def with_stints(allocations: Sequence[Allocation], stints: Iterable[Stint]) -> list[Allocation]:
    """``allocations`` (Airflow's records) with each preempted job's stints on its slots (the ledger's,
    :meth:`~trainyard.scheduling.admission.ledger.Ledger.stints`, which says why Airflow's lose them). A run's
    stints are added once, whatever number of records it has (a task per node), each from the end of the
    run's last record before it (an admission kept for a retry stays the first try's). The run's earliest
    start carries its one wait (the ``asked`` of its first record); a record of it waiting again is none."""
    by_run: dict[str, list[Stint]] = defaultdict(list)
    for stint in stints:
        by_run[stint.job_id].append(stint)
    records_of: dict[str, list[Allocation]] = defaultdict(list)
    out: list[Allocation] = []
    for a in allocations:
        (records_of[a.run] if a.run in by_run else out).append(a)
    for run, held in by_run.items():
        records = records_of[run]
        ended = [a.end for a in records if a.end is not None]
        asked = next((a.asked for a in records if a.first_try and a.asked is not None), None)
        team = next((a.team for a in records if a.team), held[0].team)
        pieces = [replace(a, asked=None, first_try=False) for a in records if a.start is not None]
        for stint in held:
            start = max([stint.admitted, *(e for e in ended if e <= stint.ended)])
            if start < stint.ended:
                pieces.append(Allocation(run, team, stint.gpu_type, stint.slots, start, stint.ended, None, False))
        if not pieces:
            continue
        first = min(range(len(pieces)), key=lambda k: pieces[k].start or 0.0)
        pieces[first] = replace(pieces[first], asked=asked, first_try=True)
        out += pieces
    return out


def allocations_from_airflow(since: float, until: float) -> list[Allocation]:
    """Every try of a training task (a task in a ``gpu-*`` pool) that overlaps the window, or whose job was
    waiting in it, from this Airflow's database. The team is the run conf's ``resources.team``, else the
    team whose own DAG ran it (``train_pipeline.<team>``), else the JobSpec's default team. Runs that
    Airflow keeps queued by a DAG's ``max_active_runs`` have no task yet: their wait before the admit task
    is not counted."""
    from datetime import UTC, datetime

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import and_, or_, select

    from trainyard.spec import Resources
    from trainyard.teams import team_of_dag

    default_team = Resources().team
    lo, hi = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)

    def ts(value) -> float | None:
        return None if value is None else value.timestamp()

    models: tuple[Any, ...] = (TaskInstance, TaskInstanceHistory)
    rows: list[TryRow] = []
    asked: dict[tuple[str, str], float] = {}
    with create_session() as session:
        for model in models:
            live = or_(model.state.is_(None), model.state.notin_(DROPPED))
            overlaps = and_(
                or_(model.end_date.is_(None), model.end_date >= lo),
                or_(model.start_date.is_(None), model.start_date <= hi),
            )
            for ti in session.scalars(select(model).where(model.pool.like(POOL_PREFIX + "%"), live, overlaps)):
                rows.append(
                    TryRow(
                        ti.dag_id,
                        ti.run_id,
                        ti.task_id,
                        ti.map_index,
                        ti.try_number,
                        None if ti.state is None else str(ti.state),
                        ti.pool,
                        ti.pool_slots,
                        ts(ti.start_date),
                        ts(ti.end_date),
                        ts(ti.queued_dttm or ti.scheduled_dttm),
                        model is TaskInstanceHistory,
                    )
                )
            admits = select(model.dag_id, model.run_id, model.start_date).where(
                model.task_id == "admit", model.start_date.is_not(None), live, model.start_date <= hi
            )
            for dag_id, run_id, started in session.execute(admits):
                key = (dag_id, run_id)
                asked[key] = min(asked.get(key, started.timestamp()), started.timestamp())
        wanted = {(r.dag_id, r.run_id) for r in rows}
        teams: dict[tuple[str, str], str] = {}
        for dag_id in {d for d, _ in wanted}:
            runs = [run_id for d, run_id in wanted if d == dag_id]
            query = select(DagRun.run_id, DagRun.conf).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(runs))
            for run_id, conf in session.execute(query):
                team = _conf_team(conf)
                teams[(dag_id, run_id)] = str(team or team_of_dag(dag_id) or default_team)
    return with_stints(allocations_from_rows(rows, asked, teams), _stints(until))


def _stints(until: float) -> list[Stint]:
    """The ledger's stints of preempted jobs up to ``until``; none where there is no ledger, one of a version
    from before stints were kept (it recorded none), or its database is unavailable (said in the log)."""
    import logging

    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.ledger_db import DatabaseUnavailable, LedgerOutdated

    try:
        ledger = existing_ledger()
        # all it keeps up to the window's end: a run's first stint, before the window, says where its wait ended
        return [] if ledger is None else ledger.stints(0.0, until)
    except LedgerOutdated:
        return []
    except DatabaseUnavailable as err:  # Airflow's records alone: the report still stands
        logging.getLogger(__name__).warning("preempted jobs' stints left out, the ledger is unavailable: %s", err)
        return []


def _conf_team(conf: Any) -> Any:
    """The team a run's conf names (as a section or by path, :func:`trainyard.form.spec_input`), if any."""
    from trainyard.form import ConfError, spec_input

    try:
        resources = spec_input(conf or {}).get("resources")
    except ConfError:
        return None
    return resources.get("team") if isinstance(resources, dict) else None
