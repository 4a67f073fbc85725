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
* **violation**: a moment at which a type's allocations exceed its slots, or a team's exceed its quota
  plus its borrowing limit.

Pure functions over :class:`Allocation` records; :func:`allocations_from_airflow` reads them from the
Airflow database (``task_instance`` and ``task_instance_history``, joined to the run's conf for the team).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.scheduling.resources import POOL_PREFIX, ResourcesConfig

# a training task in one of these states without a start never will (a skipped branch, a failed run)
NEVER_STARTED = ("skipped", "upstream_failed", "removed", "failed", "success")
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


def _above(steps: list[tuple[float, int]], limit: int) -> tuple[float, int, float | None]:
    """Seconds-times-amount above ``limit``, the highest level, and when it was first exceeded."""
    area, peak, first = 0.0, 0, None
    for (t, level), (t_next, _) in zip(steps, steps[1:], strict=False):
        peak = max(peak, level)
        if level > limit:
            area += (level - limit) * (t_next - t)
            first = t if first is None else first
    return area, peak, first


def report(
    config: ResourcesConfig,
    allocations: Sequence[Allocation],
    since: float,
    until: float,
    gpu_types: Sequence[str] | None = None,
) -> Report:
    """The window's utilisation per pool (``gpu_types``: those in the fleet figure, default every type in
    the file), per team, waits by size, borrowing and violations."""
    window = until - since
    if window <= 0:
        raise ValueError(f"the window is empty: since {since} is not before until {until}")
    types = list(gpu_types or config.gpu_types)
    unknown = [t for t in types if t not in config.gpu_types]
    if unknown:
        raise ValueError(f"GPU types {unknown} are not in the resources file; it has {sorted(config.gpu_types)}")
    pools = {t: PoolUse(slots=config.gpu_types[t].slots, capacity_s=config.gpu_types[t].slots * window) for t in types}
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
        _, peak, first = _above(_steps(s for (_, gt), ss in spans.items() if gt == t for s in ss), pool.slots)
        if first is not None:
            violations.append(f"{t}: {peak} slots allocated at once, the type has {pool.slots} (first at {first:.0f})")
    for (team_name, t), team_spans in sorted(spans.items()):
        steps = _steps(team_spans)
        quota = config.quota(team_name, t) if team_name in config.teams else 0
        borrowed, _, _ = _above(steps, quota)
        pools[t].borrowed_s += borrowed
        teams[team_name]["borrowed_s"] += borrowed
        limit = config.borrowing_limit(team_name, t) if team_name in config.teams else 0
        if limit is not None:
            _, peak, first = _above(steps, quota + limit)
            if first is not None:
                violations.append(
                    f"{t}: team {team_name} held {peak} slots, its quota {quota} + borrowing limit {limit} "
                    f"(first at {first:.0f})"
                )
    total = sum(p.allocated_s for p in pools.values())
    for team in teams.values():
        team["share"] = team["allocated_s"] / total if total else 0.0
    by_size: dict[str, list[float]] = defaultdict(list)
    longest: tuple[str, int, float] | None = None
    waiting = 0
    for a in allocations:
        if not a.first_try or a.asked is None or a.gpu_type not in pools:
            continue
        began = a.start if a.start is not None else None
        if began is None:
            if a.asked > until:
                continue
            waiting += 1
            wait = until - a.asked
        elif since <= began <= until:
            wait = max(0.0, began - a.asked)
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
    return Report(since, until, pools, dict(sorted(teams.items())), waits, longest, waiting, violations)


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
        for i, t in enumerate(times):
            if clipped[0] <= t < clipped[1]:
                row[i] += a.slots
    return times, dict(sorted(held.items()))


def chart(rep: Report, allocations: Sequence[Allocation], path: Path, title: str = "GPU slots allocated") -> Path:
    """A PNG: slots allocated over the window, stacked by team, against the pools' slots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [a for a in allocations if a.gpu_type in rep.pools]
    times, held = timeline(chosen, rep.since, rep.until)
    minutes = [(t - rep.since) / 60 for t in times]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    if held:
        ax.stackplot(minutes, *held.values(), labels=list(held), alpha=0.85, step="post")
    slots = rep.fleet.slots
    ax.axhline(slots, color="black", linewidth=1, linestyle="--", label=f"capacity ({slots} slots)")
    ax.set_xlabel("minutes since the window's start")
    ax.set_ylabel("slots allocated")
    ax.set_title(f"{title}: {rep.fleet.utilisation:.0%} of {', '.join(rep.pools)}")
    ax.set_ylim(0, slots * 1.08)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
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


def allocations_from_airflow(since: float, until: float) -> list[Allocation]:
    """Every try of a training task (a task in a ``gpu-*`` pool) that overlaps the window, or whose job was
    waiting in it, from this Airflow's database. The team is the run conf's ``resources.team`` (the
    JobSpec's default team without one)."""
    from datetime import UTC, datetime

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from trainyard.spec import Resources

    default_team = Resources().team
    lo, hi = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)

    def ts(value) -> float | None:
        return None if value is None else value.timestamp()

    out: list[Allocation] = []
    with create_session() as session:
        runs = {
            (r.dag_id, r.run_id): r.conf or {} for r in session.scalars(select(DagRun).where(DagRun.start_date <= hi))
        }
        asked = {
            (ti.dag_id, ti.run_id): ti.start_date
            for ti in session.scalars(select(TaskInstance).where(TaskInstance.task_id == "admit"))
            if ti.start_date is not None
        }
        tries: list[Any] = []  # TaskInstance and TaskInstanceHistory rows (the same columns)
        models: tuple[Any, ...] = (TaskInstance, TaskInstanceHistory)
        for model in models:
            query = select(model).where(model.pool.like(POOL_PREFIX + "%"))
            tries += [ti for ti in session.scalars(query) if (ti.dag_id, ti.run_id) in runs]
        first: dict[tuple[str, str], int] = {}
        for ti in tries:
            key = (ti.dag_id, ti.run_id)
            if ti.try_number and (key not in first or ti.try_number < first[key]):
                first[key] = ti.try_number
        for ti in tries:
            key = (ti.dag_id, ti.run_id)
            if ti.end_date is not None and ti.end_date < lo:
                continue
            conf = runs[key]
            resources = conf["resources"] if isinstance(conf.get("resources"), dict) else {}
            is_first = ti.try_number == first.get(key, ti.try_number)
            if ti.start_date is None and ti.state in NEVER_STARTED:
                continue
            began = asked.get(key) or ti.queued_dttm or ti.scheduled_dttm
            if ti.start_date is None and began is None:
                continue
            out.append(
                Allocation(
                    run=f"{ti.dag_id}/{ti.run_id}",
                    team=str(resources.get("team", default_team)),
                    gpu_type=ti.pool[len(POOL_PREFIX) :],
                    slots=ti.pool_slots,
                    start=ts(ti.start_date),
                    end=ts(ti.end_date),
                    asked=ts(began) if is_first else None,
                    first_try=is_first,
                )
            )
    return out
