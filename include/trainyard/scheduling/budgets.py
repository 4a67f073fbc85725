"""Cost and budgets.

A run costs the GPU time its tries held x its GPU type's price per slot-hour: every try's usage record
(``<run dir>/usage.jsonl``, written when its workers stop, failed tries too; time spent waiting for
admission or in a Kubernetes queue is not in it). A team's spend in a calendar month (UTC) is the cost of
its tries that ended in that month. A job admitted and still training has no record yet, so its worst case
(price x ``resources.max_hours`` x slots, less what its earlier tries cost) counts as committed until it
ends. Prices are the inventory's current ones.

``validate_spec`` refuses a job whose worst case is more than its team's monthly budget less the month's
spend and commitments, before any data is touched; the admission ledger checks again, in the transaction
that admits it (many jobs may pass validation before the first is admitted). Kubernetes trainings do not
go through the ledger yet: their cost counts once their tries are recorded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainyard.errors import spec_error_message
from trainyard.scheduling.resources import ResourcesConfig
from trainyard.spec import JobSpec, SpecError, safe_key
from trainyard.training.run_config import RUN_CONFIG_FILE
from trainyard.training.usage import USAGE_FILE, read_usage

log = logging.getLogger(__name__)


def month_of(ts: float) -> str:
    """'YYYY-MM' of an epoch time, in UTC."""
    return time.strftime("%Y-%m", time.gmtime(ts))


def worst_case(config: ResourcesConfig, gpu_type: str, slots: int, max_hours: float) -> float:
    return config.gpu_types[gpu_type].price_per_hour * max_hours * slots


@dataclass(frozen=True)
class TryCost:
    run: str  # the run directory's name: the run key made filesystem-safe
    team: str
    gpu_type: str
    ended: float
    gpu_seconds: float
    cost: float


# usage file -> ((mtime_ns, size) of the usage file and of its run config, (team, gpu_type, records)): a
# waiting job looks every few seconds and every look sums the month's spend, so a run's files are parsed
# again only when they change (a try appends a record; nothing else writes them)
_parsed: dict[Path, tuple[tuple[int, ...], tuple[str, str, list[dict]]]] = {}
_parsed_lock = threading.Lock()


def _run_usage(usage: Path) -> tuple[str, str, list[dict]]:
    config = usage.with_name(RUN_CONFIG_FILE)
    a, b = usage.stat(), config.stat()
    stamp = (a.st_mtime_ns, a.st_size, b.st_mtime_ns, b.st_size)
    with _parsed_lock:
        cached = _parsed.get(usage)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    resources = json.loads(config.read_text())["spec"]["resources"]
    records = read_usage(usage)
    parsed = (str(resources["team"]), str(resources["gpu_type"]), records)
    with _parsed_lock:
        _parsed[usage] = (stamp, parsed)
    return parsed


def tries(config: ResourcesConfig, runs_root: Path) -> Iterator[TryCost]:
    """Every recorded try under ``runs_root`` (``<job name>/<run>/usage.jsonl`` beside its run config)."""
    found = sorted(runs_root.glob(f"*/*/{USAGE_FILE}"))
    present = set(found)
    with _parsed_lock:  # forget runs that are gone (a long-lived triggerer looks for weeks)
        for gone in [p for p in _parsed if p.is_relative_to(runs_root) and p not in present]:
            del _parsed[gone]
    for usage in found:
        try:
            team, gpu_type, records = _run_usage(usage)
        except (OSError, ValueError, KeyError) as err:  # one damaged run must not stop every job's validation
            log.warning("cost of %s not counted: %s: %s", usage.parent, type(err).__name__, err)
            continue
        price = config.gpu_types[gpu_type].price_per_hour if gpu_type in config.gpu_types else 0.0
        for t in records:
            seconds = (t["ended"] - t["started"]) * t["gpus"]
            yield TryCost(usage.parent.name, team, gpu_type, t["ended"], seconds, price * seconds / 3600)


def spent_this_month(config: ResourcesConfig, runs_root: Path, now: float | None = None) -> dict[str, float]:
    """Each team's spend in the calendar month of ``now`` (the admission ledger's budget gate)."""
    month = month_of(time.time() if now is None else now)
    spent = dict.fromkeys(config.teams, 0.0)
    for t in tries(config, runs_root):
        if t.team in spent and month_of(t.ended) == month:
            spent[t.team] += t.cost
    return spent


@dataclass(frozen=True)
class TeamMonth:
    team: str
    month: str
    runs: int
    tries: int
    gpu_hours: float
    spent: float
    committed: float  # worst cases of the team's admitted jobs, less what their tries cost so far
    budget: float | None

    @property
    def left(self) -> float | None:
        return None if self.budget is None else self.budget - self.spent - self.committed


def team_months(config: ResourcesConfig, month: str, runs_root: Path, ledger=None) -> dict[str, TeamMonth]:
    """Each team's spend in ``month``; with the admission ``ledger``, the commitments of its jobs in flight."""
    all_tries = list(tries(config, runs_root))
    spent_by_run: dict[str, float] = {}
    for t in all_tries:
        spent_by_run[t.run] = spent_by_run.get(t.run, 0.0) + t.cost
    committed = dict.fromkeys(config.teams, 0.0)
    for entry in ledger.entries() if ledger is not None else []:
        job = entry.job
        if entry.admitted is None or job.team not in committed or job.gpu_type not in config.gpu_types:
            continue
        worst = worst_case(config, job.gpu_type, job.slots, job.max_hours)
        committed[job.team] += max(0.0, worst - spent_by_run.get(safe_key(job.id), 0.0))
    out = {}
    for team, spec in config.teams.items():
        mine = [t for t in all_tries if t.team == team and month_of(t.ended) == month]
        out[team] = TeamMonth(
            team=team,
            month=month,
            runs=len({t.run for t in mine}),
            tries=len(mine),
            gpu_hours=sum(t.gpu_seconds for t in mine) / 3600,
            spent=sum(t.cost for t in mine),
            committed=committed[team],
            budget=spec.monthly_budget,
        )
    return out


def check_budget(spec: JobSpec, config: ResourcesConfig, standing: TeamMonth) -> None:
    """SpecError when the job's worst case is more than what its team has left this month."""
    res = spec.resources
    left = standing.left
    if left is None:
        return
    worst = worst_case(config, res.gpu_type, res.total_gpus, res.max_hours)
    if worst > left:
        price = config.gpu_types[res.gpu_type].price_per_hour
        raise SpecError(
            spec_error_message(
                [
                    f"resources.max_hours: the job's worst case, {price:g}/slot-hour x {res.max_hours:g} h x "
                    f"{res.total_gpus} slot(s) = {worst:.2f}, is more than team {res.team!r} has left in "
                    f"{standing.month}: {max(left, 0):.2f} of {standing.budget:.2f} ({standing.spent:.2f} spent, "
                    f"{standing.committed:.2f} committed to jobs running now); ask for fewer hours or GPUs, or a "
                    f"larger monthly_budget in resources.yaml"
                ]
            )
        )
