"""Cost and budgets.

A run costs the GPU time its tries held x its GPU type's price per slot-hour: every try's usage record
(``<run dir>/usage.jsonl``, written when its workers stop, failed tries too; time spent waiting for
admission or in a Kubernetes queue is not in it). A team's spend in a calendar month (UTC) is the cost of
its tries that ended in that month. A job admitted and still training has no record yet, so its worst case
(price x ``resources.max_hours`` x slots, less what its earlier tries cost) counts as committed until it
ends. Prices are the inventory's current ones.

Every try is also appended to its month's spend journal (``<runs root>/.spend/YYYY-MM.jsonl``,
:mod:`trainyard.training.usage`): the budget gate reads this month's journal, from where it stopped at the
last look, and the usage files of the runs in the queue only, never every run directory ever made.

A job's commitment is one definition (:func:`commitment`) for ``validate_spec``, the admission ledger and
``trainyard report cost``. ``validate_spec`` refuses a job whose worst case is more than its team's monthly
budget less the month's spend and commitments, before any data is touched; the admission ledger checks
again, in the transaction that admits it (many jobs may pass validation before the first is admitted).

Kubernetes trainings do not go through the ledger (Kueue queues their pods): each one *reserves* its
commitment when its try starts (:func:`reserve`, ``<runs root>/.reservations.json``), checked
against what its team has left and written under the spend lock, so of many jobs that passed validation at
once only those that fit start. A reservation counts as committed, for validation, admission and reports,
until the try's usage is recorded (:func:`release`), or at most ``resources.max_hours`` after it was made
plus the time the pods may wait to be scheduled, where a worker died before it could say so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from trainyard.errors import RetryableError, spec_error_message
from trainyard.scheduling.resources import ResourcesConfig, run_cost
from trainyard.spec import JobSpec, SpecError, safe_key, slot_type_of
from trainyard.training.run_config import RUN_CONFIG_FILE
from trainyard.training.usage import SPEND_LOCK, USAGE_FILE, journal_dir, journal_line, month_of, read_usage

log = logging.getLogger(__name__)


def worst_case(config: ResourcesConfig, gpu_type: str, slots: int, max_hours: float) -> float:
    return config.slot_types[gpu_type].price_per_hour * max_hours * slots


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


def _run_usage(usage: Path, cache: bool = True) -> tuple[str, str, list[dict]]:
    """(team, gpu_type, try records) of a run; ``cache``: keep them for the next look (the queue's runs,
    not the whole history that filling the journal reads once)."""
    config = usage.with_name(RUN_CONFIG_FILE)
    a, b = usage.stat(), config.stat()
    stamp = (a.st_mtime_ns, a.st_size, b.st_mtime_ns, b.st_size)
    with _parsed_lock:
        cached = _parsed.get(usage)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    resources = json.loads(config.read_text())["spec"]["resources"]
    records = read_usage(usage)
    parsed = (str(resources["team"]), slot_type_of(str(resources["gpu_type"]), resources.get("mig_profile")), records)
    if cache:
        with _parsed_lock:
            _parsed[usage] = (stamp, parsed)
    return parsed


def tries(config: ResourcesConfig, runs_root: Path) -> Iterator[TryCost]:
    """Every recorded try under ``runs_root`` (``<job name>/<run>/usage.jsonl`` beside its run config): the
    whole history, read to fill the spend journal once (and by a report where it is not filled yet)."""
    for usage in sorted(runs_root.glob(f"*/*/{USAGE_FILE}")):
        yield from _run_tries(config, usage, cache=False)


def recorded_cost(config: ResourcesConfig, run_dir: Path) -> float:
    """What the recorded tries of the run in ``run_dir`` cost in all (none recorded: 0), each counted as its
    team's month counts it (at the inventory's current price). Read for a page, not kept."""
    usage = run_dir / USAGE_FILE
    return sum(t.cost for t in _run_tries(config, usage, cache=False)) if usage.is_file() else 0.0


def _run_tries(config: ResourcesConfig, usage: Path, cache: bool = True) -> Iterator[TryCost]:
    try:
        team, gpu_type, records = _run_usage(usage, cache)
    except (OSError, ValueError, KeyError) as err:  # one damaged run must not stop every job's validation
        log.warning("cost of %s not counted: %s: %s", usage.parent, type(err).__name__, err)
        return
    for t in records:
        seconds = (t["ended"] - t["started"]) * t["gpus"]
        yield TryCost(usage.parent.name, team, gpu_type, t["ended"], seconds, _cost(config, gpu_type, seconds))


def _cost(config: ResourcesConfig, gpu_type: str, gpu_seconds: float) -> float:
    """At the inventory's current price; a GPU type the inventory no longer has costs nothing."""
    return run_cost(config, gpu_type, gpu_seconds) if gpu_type in config.slot_types else 0.0


def fill_journal(config: ResourcesConfig, runs_root: Path) -> None:
    """The spend journal of a runs root made before it existed: filled once from the usage files, under the
    lock that appends take, so no try is counted twice or lost. The admission looks do it (Airflow's
    processes, which own TRAINYARD_HOME); a check or a report only reads."""
    from trainyard.files import file_lock

    target = journal_dir(runs_root)
    if target.is_dir() or not runs_root.is_dir():  # no run was ever made here: nothing to fill
        return
    with file_lock(runs_root / SPEND_LOCK):
        if target.is_dir():
            return
        months: dict[str, list[str]] = {}
        for t in tries(config, runs_root):
            line = journal_line(t.run, t.team, t.gpu_type, t.ended, t.gpu_seconds)
            months.setdefault(month_of(t.ended), []).append(line)
        staging = Path(tempfile.mkdtemp(dir=runs_root, prefix=".spend-"))
        staging.chmod(0o770)  # as trainyard's state is (mkdtemp's 0700 would shut out the group)
        for month, lines in months.items():
            (staging / f"{month}.jsonl").write_text("".join(line + "\n" for line in lines))
        staging.rename(target)


# month journal -> ((device, inode), bytes read, its tries): a look reads what was appended since the last
_journals: dict[Path, tuple[tuple[int, int], int, list[tuple[str, str, str, float, float]]]] = {}
_journals_lock = threading.Lock()


def _journal(runs_root: Path, month: str) -> list[tuple[str, str, str, float, float]]:
    """(run, team, gpu_type, ended, gpu_seconds) of every try that ended in ``month``; a line that does not
    parse is skipped with a warning naming the file and the byte it starts at."""
    path = journal_dir(runs_root) / f"{month}.jsonl"
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            with _journals_lock:
                identity, read, known = _journals.get(path, ((0, 0), 0, []))
            if identity != (st.st_dev, st.st_ino) or st.st_size < read:  # a new or replaced file: from its start
                read, known = 0, []
            f.seek(read)
            data = f.read()
    except FileNotFoundError:
        return []
    complete = data.rfind(b"\n") + 1  # a line being appended right now is read at the next look
    found = list(known)
    offset = read
    for raw in data[:complete].splitlines(keepends=True):
        try:
            entry = json.loads(raw)
            ended, seconds = float(entry["ended"]), float(entry["gpu_seconds"])
            if not (math.isfinite(ended) and math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"ended {ended}, gpu_seconds {seconds}")
            found.append((str(entry["run"]), str(entry["team"]), str(entry["gpu_type"]), ended, seconds))
        except (ValueError, KeyError, TypeError, ArithmeticError) as err:
            log.warning("%s: the line at byte %d is not a try, not counted (%s)", path, offset, err)
        offset += len(raw)
    with _journals_lock:
        _journals[path] = ((st.st_dev, st.st_ino), read + complete, found)
    return found


def month_tries(config: ResourcesConfig, runs_root: Path, month: str) -> list[TryCost]:
    """Every try that ended in ``month``, priced at the inventory's current prices: from the month's
    journal, or, where it was never filled (no look ran here yet), from the usage files."""
    if not journal_dir(runs_root).is_dir():
        return [t for t in tries(config, runs_root) if month_of(t.ended) == month]
    return [TryCost(r, t, g, e, sec, _cost(config, g, sec)) for r, t, g, e, sec in _journal(runs_root, month)]


def spent_this_month(config: ResourcesConfig, runs_root: Path, now: float | None = None) -> dict[str, float]:
    """Each team's spend in the calendar month of ``now`` (the admission ledger's budget gate)."""
    spent = dict.fromkeys(config.teams, 0.0)
    for t in month_tries(config, runs_root, month_of(time.time() if now is None else now)):
        if t.team in spent:
            spent[t.team] += t.cost
    return spent


def run_spent(config: ResourcesConfig, runs_root: Path, run_key: str) -> float:
    """What the tries of the run ``run_key`` cost so far, in any month (its own usage file)."""
    return sum(
        t.cost for usage in runs_root.glob(f"*/{safe_key(run_key)}/{USAGE_FILE}") for t in _run_tries(config, usage)
    )


class Claim(Protocol):
    """What a commitment is computed from: an admitted job (``admission.policy.Job``) or a Kubernetes training's
    :class:`Reservation`."""

    @property
    def gpu_type(self) -> str: ...
    @property
    def slots(self) -> int: ...
    @property
    def max_hours(self) -> float: ...


def commitment(config: ResourcesConfig, job: Claim, spent_by_its_run: float) -> float:
    """What an admitted job still commits of its team's budget: its worst case (price x max_hours x slots)
    less what its run's tries already cost. The one definition, for the ledger, ``validate_spec`` and
    ``trainyard report cost``."""
    return max(0.0, worst_case(config, job.gpu_type, job.slots, job.max_hours) - spent_by_its_run)


@dataclass(frozen=True)
class Spend:
    """What the budget gate weighs: each team's spend this month, what a run's tries cost so far, and what
    its Kubernetes trainings reserve (:func:`reserve`)."""

    this_month: Mapping[str, float]
    of_run: Callable[[str], float]  # run key -> cost of its recorded tries
    reserved: Mapping[str, float] = field(default_factory=dict)  # team -> its Kubernetes trainings' reservations


def current_spend(config: ResourcesConfig, runs_root: Path, now: float | None = None) -> Spend:
    """The :class:`Spend` of now: this month's journal, and each run's own usage file when it is asked for
    (the runs in the queue whose team has a budget): a look costs what the queue holds, not what the run
    history holds."""
    known: dict[str, float] = {}

    def of_run(run_key: str) -> float:
        if run_key not in known:
            known[run_key] = run_spent(config, runs_root, run_key)
        return known[run_key]

    return Spend(spent_this_month(config, runs_root, now), of_run, reserved(config, runs_root, now))


@dataclass(frozen=True)
class TeamMonth:
    team: str
    month: str
    runs: int
    tries: int
    gpu_hours: float
    spent: float
    committed: float  # what the team's admitted jobs and Kubernetes trainings still commit (commitment)
    budget: float | None

    @property
    def left(self) -> float | None:
        return None if self.budget is None else self.budget - self.spent - self.committed


def team_standing(fleet: ResourcesConfig, team: str, ledger=None, month: str | None = None) -> TeamMonth:
    """The team's spend and commitments this month (or ``month``), from this host's run records and, with
    the admission ``ledger`` (``admission.ledger.existing_ledger``), its jobs in flight."""
    from trainyard import paths

    return team_months(fleet, month or month_of(time.time()), paths.runs_root(), ledger)[team]


def team_months(config: ResourcesConfig, month: str, runs_root: Path, ledger=None) -> dict[str, TeamMonth]:
    """Each team's spend in ``month``; with the admission ``ledger``, the commitments of its jobs in flight."""
    month_spend = month_tries(config, runs_root, month)
    committed = dict.fromkeys(config.teams, 0.0)
    for entry in ledger.entries() if ledger is not None else []:
        job = entry.job
        if entry.admitted is None or job.team not in committed or job.gpu_type not in config.slot_types:
            continue
        committed[job.team] += commitment(config, job, run_spent(config, runs_root, job.id))
    for team, amount in reserved(config, runs_root).items():
        committed[team] += amount
    out = {}
    for team, spec in config.teams.items():
        mine = [t for t in month_spend if t.team == team]
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
    """SpecError when the job's worst case is more than what its team has left this month; for a sweep,
    that of ``sweep.parallelism`` trials at once, or of all its trials if fewer. Each trial is admitted
    only while its own worst case fits, so a sweep that cannot afford as many as it asks would crawl."""
    res = spec.resources
    left = standing.left
    if left is None:
        return
    at_once = min(spec.sweep.parallelism, spec.sweep.trials) if spec.sweep is not None else 1
    worst = at_once * worst_case(config, res.slot_type, res.total_gpus, res.max_hours)
    if worst > left:
        price = config.slot_types[res.slot_type].price_per_hour
        what = (
            "the job's worst case"
            if at_once == 1
            else f"the worst case of {at_once} trials at once (sweep.parallelism)"
        )
        trials = "" if at_once == 1 else f" x {at_once}"
        raise SpecError(
            spec_error_message(
                [
                    f"resources.max_hours: {what}, {price:g}/slot-hour x {res.max_hours:g} h x "
                    f"{res.total_gpus} slot(s){trials} = {worst:.2f}, is more than team {res.team!r} has left in "
                    f"{standing.month}: {max(left, 0):.2f} of {standing.budget:.2f} ({standing.spent:.2f} spent, "
                    f"{standing.committed:.2f} committed to jobs running now); ask for fewer hours or GPUs"
                    f"{'' if at_once == 1 else ', or a lower sweep.parallelism'}, or a larger monthly_budget in "
                    "resources.yaml"
                ]
            )
        )


# -- Kubernetes trainings' reservations -------------------------------------------------------------------
RESERVATIONS_FILE = ".reservations.json"  # in the runs root, beside the spend journal


@dataclass(frozen=True)
class Reservation:
    """A Kubernetes training's hold on its team's budget, from its try's start until its usage is recorded."""

    team: str
    gpu_type: str
    slots: int
    max_hours: float
    made: float  # when (epoch seconds)
    until: float  # when it lapses if nobody releases it: made + the pods' schedule timeout + max_hours


def _reservations_path(runs_root: Path) -> Path:
    return runs_root / RESERVATIONS_FILE


def reservations(runs_root: Path, now: float | None = None) -> dict[str, Reservation]:
    """The run key -> :class:`Reservation` of the Kubernetes trainings that hold one now (lapsed ones left
    out)."""
    path = _reservations_path(runs_root)
    try:
        held = {key: Reservation(**fields) for key, fields in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError) as err:  # one bad file must not stop every look
        raise BadReservations(f"{path} is not a reservations file ({err}); move it away to reset it") from None
    now = time.time() if now is None else now
    return {key: r for key, r in held.items() if r.until > now}


class BadReservations(RetryableError):
    """The reservations file cannot be read: a reservation is refused until it is fixed, and budgets are
    weighed without the reservations meanwhile (the log says so)."""


def reserved(config: ResourcesConfig, runs_root: Path, now: float | None = None) -> dict[str, float]:
    """Each team's sum of its Kubernetes trainings' commitments (:func:`commitment`) now; none, logged, where
    the reservations file cannot be read."""
    try:
        held = reservations(runs_root, now)
    except BadReservations as err:
        log.error("%s; weighing budgets without the Kubernetes trainings' reservations", err)
        return {}
    out: dict[str, float] = {}
    for key, r in held.items():
        if r.team in config.teams and r.gpu_type in config.slot_types:
            out[r.team] = out.get(r.team, 0.0) + commitment(config, r, run_spent(config, runs_root, key))
    return out


def _write_reservations(runs_root: Path, held: Mapping[str, Reservation]) -> None:
    from trainyard.files import atomic_write

    path = _reservations_path(runs_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({key: asdict(r) for key, r in held.items()}, indent=1).encode())


def reserve(
    config: ResourcesConfig, runs_root: Path, spec: JobSpec, run_key: str, *, wait_s: float, ledger=None
) -> Reservation:
    """Reserve the Kubernetes training ``run_key``'s commitment against its team's budget, or raise
    SpecError naming what is left: checked and written under the spend lock, so two trainings never both
    take the last of a budget. A second call for the same run (a retry whose earlier try could not end
    its reservation) keeps its place, lapsing from now. ``wait_s``: how long its pods may take to start
    (the reservation lapses that much after ``max_hours``). ``ledger``: the admission ledger, whose
    admitted jobs commit too."""
    from trainyard.files import file_lock

    res = spec.resources
    now = time.time()
    with file_lock(runs_root / SPEND_LOCK):
        held = reservations(runs_root, now)
        made = Reservation(
            res.team, res.slot_type, res.total_gpus, res.max_hours, now, now + wait_s + res.max_hours * 3600
        )
        if run_key in held:  # a retry: counted already; it lapses from this try's start
            _write_reservations(runs_root, {**held, run_key: made})
            return made
        if res.team not in config.teams:
            raise SpecError(spec_error_message([f"resources.team: {res.team!r} is not in resources.yaml"]))
        standing = team_months(config, month_of(now), runs_root, ledger)[res.team]
        owed = commitment(config, made, run_spent(config, runs_root, run_key))
        if standing.left is not None and owed > standing.left:
            raise SpecError(
                spec_error_message(
                    [
                        f"resources.max_hours: the training's worst case, {owed:.2f}, is more than team "
                        f"{res.team!r} has left in {standing.month}: {max(standing.left, 0):.2f} of "
                        f"{standing.budget:.2f} ({standing.spent:.2f} spent, {standing.committed:.2f} committed "
                        "to jobs running now); wait for them to end, ask for fewer hours or GPUs, or a larger "
                        "monthly_budget in resources.yaml"
                    ]
                )
            )
        _write_reservations(runs_root, {**held, run_key: made})
        return made


def release(runs_root: Path, run_key: str) -> None:
    """End the reservation of ``run_key`` (its try's usage is recorded, or it never started); lapsed ones
    go with it."""
    from trainyard.files import file_lock

    with file_lock(runs_root / SPEND_LOCK):
        if _reservations_path(runs_root).exists():
            held = reservations(runs_root)
            held.pop(run_key, None)
            _write_reservations(runs_root, held)
