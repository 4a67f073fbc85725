"""A sweep's Optuna study: where it lives, how it samples and prunes, and how a sweep run ends.

Storage: one Optuna journal file per team, ``$TRAINYARD_HOME/sweeps/<team>/studies.journal``, each
sweep a study in it named by ``sweep.name``. The journal file backend is Optuna's advice for parallel
trials without a database server: every write is an append under a file lock, so the training tasks of
one sweep (separate processes) ask and tell concurrently without SQLite's one-writer stalls. It needs a
local or fcntl-capable filesystem, as the admission ledger's SQLite file does (all of Airflow on one
host). With ``TRAINYARD_DATABASE_URL`` (the cluster profile: workers on several hosts) the studies are
Optuna's RDB storage in that PostgreSQL database, a schema per team, and the one-ask-at-a-time lock is a
PostgreSQL advisory lock. Teams are the boundary: a sweep resumes or warm-starts only from its own team's
studies.

Optuna's journal storage (the default here) has no heartbeat (Optuna 5.0: only its RDB storage does, and
only ``study.optimize`` starts the thread that beats; ask/tell, which the trial tasks use, starts none), so
a trial whose training process is killed would stay RUNNING. The DAG tells Optuna instead
(:func:`fail_left_running`), one way for both storages: a retry of the trial's task fails the trial its
earlier try left running (:func:`trainyard.sweeps.trials.run_trial`), the sweep's last task (:func:`close`)
fails every trial of its run still running once all of them are done, and a trial whose task has not said
it runs (:data:`ALIVE_ATTR`) for :data:`STALE_AFTER_S` counts as dead. Optuna's own heartbeat and
``fail_stale_trials`` would serve the RDB storage alone, beside this for the journal;
tests/unit/sweeps/test_study.py fails once Optuna's journal gets a heartbeat, to switch to it then.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard import paths
from trainyard.errors import PermanentError
from trainyard.pipeline.records import TrainingResult, metrics_folded
from trainyard.spec import NOT_TRAINED, JobSpec, SearchParameter, Sweep

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

JOURNAL = "studies.journal"
# Trial user attributes, set by the platform
RUN_ATTR = "sweep_run"  # the Airflow run ("<dag_id>/<run_id>") whose task ran the trial
SLOT_ATTR = "slot"  # its mapped task: "<run>#<map index>"
SPEC_ATTR = "spec"  # the trial's JobSpec (the sweep's, with the trial's values), as JSON
TRAINED_ATTR = "trained"  # what its training left, a TrainingResult as JSON (:func:`trained_of`)
FAILED_ATTR = "failed_because"
LINEAGE_ATTR = "lineage"  # what the trial trained on and how, less its values (:func:`lineage`)
ALIVE_ATTR = "alive_at"  # when its training task last said it runs (epoch seconds)
# the study's: the trial close() chose for a sweep run (by its run key), read by finished_trial
CHOSEN_ATTR_PREFIX = "chosen:"
WARM_START_ATTR = "warm_started_from"  # a trial copied from an earlier sweep ("<sweep>#<number>")
ALIVE_EVERY_S = 60.0  # how often a trial's task says so ...
STALE_AFTER_S = 15 * 60.0  # ... and how long without it before a RUNNING trial counts as dead


class SweepError(PermanentError):
    """The sweep cannot go on as asked (a study of another objective, no finished trial, ...)."""


class GridSpent(SweepError):
    """A grid sweep's slot finds every point taken (two runs of one sweep at once): it trains nothing."""


def storage_path(team: str) -> Path:
    return paths.sweeps_root() / team / JOURNAL


def storage(team: str) -> optuna.storages.BaseStorage:
    """The team's study storage (created on first use): its journal file, or its schema of the shared
    PostgreSQL database."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from trainyard.scheduling.ledger_db import shared_database_url

    url = shared_database_url()
    if url:
        return _database_storage(url, team)
    path = storage_path(team)
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def team_schema(team: str) -> str:
    """The PostgreSQL schema of a team's studies: readable, and distinct for distinct team names (a team
    name may hold '.' and '-', which the readable part folds into '_')."""
    import hashlib
    import re

    return f"sweeps_{re.sub(r'[^a-z0-9]', '_', team)[:32]}_{hashlib.sha256(team.encode()).hexdigest()[:8]}"


@functools.cache
def _database_storage(url: str, team: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on the team's schema, made once per process (its engine keeps a small pool).
    Making the schema and Optuna's tables is one process at a time (an advisory lock): Optuna creates its
    tables on first use, and two hosts doing that at once collide."""
    from optuna.storages import RDBStorage

    from trainyard.scheduling.ledger_db import PostgresDb, advisory_lock, sqlalchemy_url

    schema = team_schema(team)
    with advisory_lock(url, "trainyard.sweeps.schema"):
        with PostgresDb.connect(url) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')  # a name of [a-z0-9_] only
            conn.commit()
        return RDBStorage(
            sqlalchemy_url(url),
            engine_kwargs={"connect_args": {"options": f"-c search_path={schema}"}, "pool_pre_ping": True},
        )


@contextlib.contextmanager
def ask_lock(team: str, sweep_name: str) -> Iterator[None]:
    """One ask at a time in a study, among every process of every host that runs its trials; the study's
    creation (with its objective) is made under it too."""
    from trainyard.files import file_lock
    from trainyard.scheduling.ledger_db import advisory_lock, shared_database_url

    url = shared_database_url()
    if url:
        with advisory_lock(url, f"trainyard.sweeps.ask/{team}/{sweep_name}"):
            yield
        return
    with file_lock(storage_path(team).with_name(f"{sweep_name}.ask.lock")):
        yield


def sampler(sweep: Sweep, asked: int = 0) -> optuna.samplers.BaseSampler:
    """The sweep's sampler for the ask that follows ``asked`` trials of its study. Every trial task makes
    its own, so a seeded random draw (the random sampler, TPE's startup trials) is seeded per ask from
    ``sweep.seed`` and ``asked``: one seed for every ask would hand each trial the same values. Asked under
    the ask lock, so no two asks count the same ``asked``. A grid sweep's trials get their values from
    :func:`queue_grid_point`, its sampler draws nothing."""
    import optuna

    seed = None if sweep.seed is None else ask_seed(sweep.seed, asked)
    if sweep.sampler in ("random", "grid"):  # a grid trial's values are queued with it (queue_grid_point)
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        n_startup_trials=max(sweep.startup_trials, 1),
        multivariate=True,
        constant_liar=True,  # parallel trials: a running trial counts as a bad one, so others look elsewhere
        seed=seed,  # the constraints it weighs are each trial's own (Trial.set_constraint)
    )


def ask_seed(seed: int, asked: int) -> int:
    """A seed of its own for each ask of a seeded sweep: the same sweep seed gives the same sequence."""
    import numpy as np

    return int(np.random.SeedSequence([seed, asked]).generate_state(1)[0])


def pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    """Stops a trial at an epoch's end (its reporting step is the epoch, 1-based), never before it has
    run ``warmup_epochs``."""
    import optuna

    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials, n_warmup_steps=sweep.warmup_epochs)
    if sweep.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(sweep.warmup_epochs, 1))
    return optuna.pruners.NopPruner()


def open_study(spec: JobSpec) -> optuna.Study:
    """The sweep's study, created on its first run, loaded on every later one (a resumed sweep); a new
    study with ``warm_start_from`` starts with that sweep's finished trials. Refused: a study of the same
    name that optimises another objective or direction."""
    import optuna

    sweep = _sweep(spec)
    store = storage(spec.resources.team)
    # The study and its objective are made under the ask lock: the first trials of a sweep start together,
    # and one that loaded the study between another's create and set_user_attr would see no objective
    with ask_lock(spec.resources.team, sweep.name):
        study = optuna.create_study(
            storage=store,
            study_name=sweep.name,
            direction=sweep.direction,
            sampler=sampler(sweep),
            pruner=pruner(sweep),
            load_if_exists=True,
        )
        attrs = study.user_attrs
        if not attrs:
            study.set_user_attr("objective", sweep.objective)
            study.set_user_attr("direction", sweep.direction)
            attrs = study.user_attrs
    if (attrs.get("objective"), attrs.get("direction")) != (sweep.objective, sweep.direction):
        raise SweepError(
            f"sweep.name: study {sweep.name!r} of team {spec.resources.team} optimises "
            f"{attrs.get('direction')} {attrs.get('objective')}; this spec asks to {sweep.direction} "
            f"{sweep.objective}: name a new sweep, or keep its objective and direction"
        )
    return study


def warm_start(spec: JobSpec, study: optuna.Study) -> int:
    """Seed an empty study with the finished trials of ``sweep.warm_start_from`` (the same team's) whose
    values lie in this search space; how many were added."""
    import optuna

    sweep = _sweep(spec)
    if sweep.warm_start_from is None or study.trials:
        return 0
    names = optuna.get_all_study_names(storage(spec.resources.team))
    if sweep.warm_start_from not in names:
        raise SweepError(
            f"sweep.warm_start_from: team {spec.resources.team} has no sweep {sweep.warm_start_from!r} "
            f"(it has {sorted(names)})"
        )
    source = optuna.load_study(study_name=sweep.warm_start_from, storage=storage(spec.resources.team))
    space = distributions(sweep)
    added = 0
    for t in source.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if set(t.params) != set(space) or not all(_fits(space[k], v) for k, v in t.params.items()):
            continue
        study.add_trial(
            optuna.trial.create_trial(
                params=t.params,
                distributions=space,
                value=t.value,
                intermediate_values=t.intermediate_values,
                user_attrs={WARM_START_ATTR: f"{sweep.warm_start_from}#{t.number}"},
            )
        )
        added += 1
    log.info("warm start: %d finished trial(s) of sweep %s seeded study %s", added, sweep.warm_start_from, sweep.name)
    return added


def _fits(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except (ValueError, TypeError):  # a choice this space does not have
        return False


def distributions(sweep: Sweep) -> dict[str, optuna.distributions.BaseDistribution]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for p in sweep.parameters:
        if p.type == "categorical":
            out[p.name] = CategoricalDistribution(list(p.choices))
        elif p.type == "int":
            assert p.low is not None and p.high is not None
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            assert p.low is not None and p.high is not None
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def suggest(trial: optuna.Trial, p: SearchParameter) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(p.name, list(p.choices))
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return trial.suggest_float(p.name, p.low, p.high, log=p.log, step=p.step)


def with_values(spec: JobSpec, values: dict[str, Any]) -> JobSpec:
    """The JobSpec of one trial: the sweep's spec with ``values`` ({"hyperparameters.learning_rate": 0.01})
    in place; validated like any spec (SpecError naming the field)."""
    from trainyard.spec import parse_spec

    raw = spec.model_dump(mode="json")
    for name, value in values.items():
        section, key = name.split(".", 1)
        raw[section] = {**raw[section], key: value}
    return parse_spec(raw)


def lineage(spec: JobSpec, commit: str) -> str:
    """A digest of the dataset ``commit`` and the spec less the sweep and its values: trials of a resumed
    study compete for "best" only with trials of the same lineage, so a model is never registered with
    data or settings it was not trained with."""
    import hashlib

    sweep = _sweep(spec)
    raw = spec.model_dump(mode="json", exclude={"sweep", *NOT_TRAINED})
    for p in sweep.parameters:
        section, key = p.field
        raw[section].pop(key, None)
    text = json.dumps({"dataset": commit, "spec": raw}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sweep(spec: JobSpec) -> Sweep:
    if spec.sweep is None:
        raise SweepError("the spec has no sweep section")
    return spec.sweep


def best_trial(study: optuna.Study, of_lineage: str) -> optuna.trial.FrozenTrial | None:
    """The best finished trial of ``of_lineage`` (:func:`lineage`) that meets every constraint and whose
    model is still on disk."""
    import optuna

    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(LINEAGE_ATTR) == of_lineage
        and t.value is not None
        and math.isfinite(t.value)
        and all(v <= 0 for v in t.constraints.values())
        and TRAINED_ATTR in t.user_attrs
        and _has_model(t)
    ]
    if not done:
        return None
    pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    return pick(done, key=lambda t: float(t.value or 0.0))


def _has_model(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the model file a finished trial left (a built-in recipe's model.pt, a custom program's
    model.onnx) is still there. A trial whose stored record is not one (another shape, from an older
    trainyard) has none that can be registered: logged, not fatal to the sweep."""
    from pydantic import ValidationError

    try:
        trained = trained_of(trial)
    except ValidationError as err:
        log.warning("trial %d: its stored training result is not a TrainingResult (%s); passed over", trial.number, err)
        return False
    model = trained.model_file()
    return model is not None and Path(model).is_file()


def trained_of(trial: optuna.trial.FrozenTrial) -> TrainingResult:
    """What a finished trial's training left (its ``TRAINED_ATTR``, stored by its task as JSON), as the
    record. One stored before the record had its built-in recipe's val_* metrics beside the other fields:
    they are its final metrics."""
    stored = metrics_folded(trial.user_attrs[TRAINED_ATTR])
    return TrainingResult.model_validate(stored)  # the platform's own file (the study's journal), not an XCom


def _chosen(trial: optuna.trial.FrozenTrial, sweep_name: str) -> TrainingResult:
    """What the trial a sweep run chose left (:func:`trained_of`), marked with its sweep and number."""
    return trained_of(trial).model_copy(update={"sweep": sweep_name, "sweep_trial": trial.number})


def finished_trial(spec: JobSpec, sweep_run: str) -> tuple[JobSpec, TrainingResult]:
    """The trial that :func:`close` chose for the sweep run ``sweep_run``, as the study keeps it (the
    platform's own store, which no user writes): the JobSpec it trained with (the sweep's, with the trial's
    values) and what its training left, marked with its sweep and number. What a sweep run's evaluate, gate,
    export and register use, not the ``training_result`` XCom they are handed, which a user may write.
    NotAllowed where that run chose none (its close_sweep did not succeed, or the job is another)."""
    import optuna

    from trainyard.teams import NotAllowed

    sweep = _sweep(spec)
    study = optuna.load_study(study_name=sweep.name, storage=storage(spec.resources.team))
    number = study.user_attrs.get(CHOSEN_ATTR_PREFIX + sweep_run)
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number] if number is not None else []
    trial_spec = JobSpec.model_validate(found[0].user_attrs[SPEC_ATTR]) if found else None
    if trial_spec is None or trial_spec.name != spec.name:
        raise NotAllowed(
            f"sweep {sweep.name!r} of team {spec.resources.team} chose no trial of job {spec.name!r} in run "
            f"{sweep_run}: this task's input was changed, or its close_sweep did not succeed; trigger the job again"
        )
    return trial_spec, _chosen(found[0], sweep.name)


def tell(study: optuna.Study, trial: optuna.Trial | int, value: float | None = None, state=None) -> None:
    """``study.tell``; a trial already told (by another look at a trial left running) stays as told."""
    study.tell(trial, value, state=state, skip_if_finished=True)


def grid_points(sweep: Sweep) -> list[dict[str, Any]]:
    """Every point of a grid sweep, in the order its trials take them: shuffled by ``sweep.seed`` (the same
    seed, the same order), in a new random order without one."""
    import itertools
    import random

    names = [p.name for p in sweep.parameters]
    points = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*(p.choices for p in sweep.parameters))
    ]
    random.Random(sweep.seed).shuffle(points)
    return points


def _point(values: dict[str, Any], space: dict[str, Any]) -> str:
    """A grid point's key: the index of each value among its parameter's choices, as Optuna finds it (by
    equality, so that a study resumed with 1 where it had 1.0 knows the point)."""
    return json.dumps({k: space[k].to_internal_repr(v) for k, v in values.items()}, sort_keys=True)


def _trials_by_point(trials: list[optuna.trial.FrozenTrial], sweep: Sweep) -> dict[str, list]:
    """A grid sweep's trials by the point they took (asked, or queued and not asked yet), as
    :func:`_point`. Only trials of this grid count (a resumed sweep whose choices changed has a new grid),
    and only trials trained in this study: a warm start's copies guide no grid and are never its best."""
    space = distributions(sweep)
    by_point: dict[str, list] = {}
    for t in trials:
        if WARM_START_ATTR in t.user_attrs:
            continue
        queued = t.system_attrs.get("fixed_params") if not t.params else None
        if queued is not None:
            ours = set(queued) == set(space) and all(v in space[k].choices for k, v in queued.items())  # type: ignore[attr-defined]
        else:
            ours = t.distributions == space
        if ours:
            by_point.setdefault(_point(queued or t.params, space), []).append(t)
    return by_point


def _lost(tried: list[optuna.trial.FrozenTrial]) -> bool:
    """A grid point's only trial failed (its worker killed, its host gone): it is trained again, once."""
    import optuna

    return len(tried) == 1 and tried[0].state == optuna.trial.TrialState.FAIL


def _grid_left(study: optuna.Study, sweep: Sweep) -> list[dict[str, Any]]:
    """The points of a grid sweep still to be trained, in the order they are taken: those whose only trial
    failed, then those no trial has taken. One rule for every trial the study holds (from an earlier run,
    a warm start, another sampler or seed), which is why the sweep walks its grid itself rather than
    through Optuna's grid sampler: that one counts a failed trial's point as done, and hands a trial its
    point by the trial's number whatever the study already holds."""
    space = distributions(sweep)
    by_point = _trials_by_point(study.get_trials(deepcopy=False), sweep)
    lost = [tried[0].params for tried in by_point.values() if _lost(tried)]
    return lost + [p for p in grid_points(sweep) if _point(p, space) not in by_point]


def grid_points_left(study: optuna.Study, sweep: Sweep) -> int:
    """How many points of a grid sweep are still to be trained (:func:`_grid_left`)."""
    return len(_grid_left(study, sweep))


def queue_grid_point(study: optuna.Study, sweep: Sweep) -> None:
    """Queue the point the next ask of a grid sweep trains (its values fixed on the trial); GridSpent when
    every point is taken. A point queued before (by a process that died before its ask) is asked first.
    Called under the ask lock."""
    import optuna

    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if waiting:
        if _trials_by_point(waiting[:1], sweep):
            return  # the next ask takes it (Optuna asks the queued trials in their order)
        raise SweepError(
            f"sweep {sweep.name}: trial {waiting[0].number} is queued with values of another grid "
            f"({waiting[0].system_attrs.get('fixed_params')}); name a new sweep"
        )
    left = _grid_left(study, sweep)
    if not left:
        raise GridSpent(
            f"sweep {sweep.name}: every point of its grid is taken (trained, failed twice, or training in "
            "another run); this slot trains nothing"
        )
    study.enqueue_trial(left[0])


def fail_left_running(
    study: optuna.Study, sweep_run: str | None, slot: str | None = None, why: str = "", now: float | None = None
) -> list[int]:
    """Tell Optuna that trials still RUNNING failed, their training process being gone: those of
    ``sweep_run`` (of one ``slot``, if given: its task was retried, or the whole sweep run is done), and
    with ``now``, every one whose task has not said it runs for :data:`STALE_AFTER_S` (a run marked
    failed by hand, a process killed before it named its run). Their numbers."""
    import optuna

    failed = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        ours = (
            sweep_run is not None
            and t.user_attrs.get(RUN_ATTR) == sweep_run
            and (slot is None or t.user_attrs.get(SLOT_ATTR) == slot)
        )
        seen = t.user_attrs.get(ALIVE_ATTR) or (t.datetime_start.timestamp() if t.datetime_start else 0.0)
        stale = now is not None and now - float(seen) > STALE_AFTER_S
        if not (ours or stale):
            continue
        study._storage.set_trial_user_attr(t._trial_id, FAILED_ATTR, why)
        tell(study, t.number, state=optuna.trial.TrialState.FAIL)
        failed.append(t.number)
    return failed


def close(spec: JobSpec, commit: str, sweep_run: str) -> dict:
    """The end of a sweep run, once each of its trial tasks is done (succeeded or failed): its trials still
    RUNNING are failed (their processes are gone), the study's best trial on the dataset ``commit`` is chosen,
    and the summary goes to MLflow. Returns the best trial's ``{"trained", "trial", "value", ...}``:
    ``trained`` (its TrainingResult, marked with its sweep and number) goes on to evaluate, gate, export and
    register, which read the trial again from the study, where the choice is recorded (:func:`finished_trial`);
    SweepError if no trial finished within the constraints."""
    import time

    import optuna

    from trainyard.sweeps.summary import log_summary

    study = open_study(spec)
    failed = fail_left_running(
        study, sweep_run, why="its task ended without finishing it (the process was killed)", now=time.time()
    )
    if failed:
        log.warning("trials %s of %s were left running by a task that is gone: failed", failed, sweep_run)
    states: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(RUN_ATTR) == sweep_run:
            states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    tally = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    log.info("sweep %s, run %s: %s", study.study_name, sweep_run, tally)
    of_lineage = lineage(spec, commit)
    best = best_trial(study, of_lineage)
    summary = log_summary(spec, study, sweep_run, best)
    if best is None:
        gone = [
            t.number
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get(LINEAGE_ATTR) == of_lineage and TRAINED_ATTR in t.user_attrs and not _has_model(t)
        ]
        why = f"; trials {gone} finished, but left no model file that is still there" if gone else ""
        raise SweepError(
            f"sweep {study.study_name}: no trial on this data and spec finished with a finite "
            f"{spec.sweep.objective if spec.sweep else ''} within the constraints ({states}){why}; nothing to register"
        )
    log.info("best trial: #%d, %s = %s, %s", best.number, study.user_attrs.get("objective"), best.value, best.params)
    study.set_user_attr(CHOSEN_ATTR_PREFIX + sweep_run, best.number)  # what the run's later steps read
    return {
        "trained": _chosen(best, study.study_name),
        "trial": best.number,
        "value": best.value,
        "params": best.params,
        "states": states,
        "summary_run_id": summary,
    }
