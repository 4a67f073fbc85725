"""Stage 3, a sweep's way: the study opened or resumed (:func:`plan_sweep`), a trial per mapped task trained
like a job of its own (:func:`train_trial`), and the sweep's end, its best trial chosen (:func:`close_sweep`).
Then, for every run, what it trained as the later steps take it (:func:`trained_job`): a sweep's chosen
trial, or a training's result held to its run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trainyard.pipeline.records import PinnedDataset, PreparedData, TrainingResult, held_training, run_dir
from trainyard.pipeline.train import LocalLaunch, log_validation, train
from trainyard.spec import JobSpec

log = logging.getLogger(__name__)


def plan_sweep(spec: JobSpec) -> list[int]:
    """Open (or resume) the sweep's study, seed a new one from ``warm_start_from``: the slots of this run,
    one mapped training task each."""
    import time

    from trainyard.sweeps.study import SweepError, ask_lock, fail_left_running, grid_points_left, open_study, warm_start

    assert spec.sweep is not None
    study = open_study(spec)
    stale = fail_left_running(study, None, why="its task stopped saying it runs", now=time.time())
    if stale:
        log.warning("sweep %s: trials %s were RUNNING with no task left running them: failed", spec.sweep.name, stale)
    with ask_lock(spec.resources.team, spec.sweep.name):  # two runs of a new study seed it once
        warm_start(spec, study)
    trials = spec.sweep.trials
    if spec.sweep.sampler == "grid":  # a resumed grid sweep trains the points it has not trained yet
        left = grid_points_left(study, spec.sweep)
        if left == 0:
            raise SweepError(
                f"sweep.name: every point of the grid of sweep {spec.sweep.name!r} has been taken (trained, "
                "failed twice, or training in another run); resume it with another sampler (random or tpe), "
                "widen its choices, or name a new sweep"
            )
        trials = min(trials, left)
    log.info(
        "sweep %s: %d trial(s) in the study so far; this run adds %d, %d at a time",
        spec.sweep.name,
        len(study.trials),
        trials,
        spec.sweep.parallelism,
    )
    return list(range(trials))


def train_trial(
    spec: JobSpec,
    dataset: PinnedDataset,
    data: PreparedData,
    sweep_run: str,
    slot: int,
    local: LocalLaunch | None = None,
) -> dict:
    """One trial of the sweep in ``spec`` on this machine, in slot ``slot`` of the run ``sweep_run``:
    planned, launched (as ``local`` says, its workers stopped by the trial's watcher) and collected as a job
    of its own (:func:`trainyard.sweeps.trials.run_trial`), its MLflow run tagged with ``local``'s tags and
    the trial's."""
    from trainyard.sweeps.study import lineage
    from trainyard.sweeps.trials import Watcher, run_trial

    assert spec.sweep is not None
    objective = spec.sweep.objective
    local = local or LocalLaunch()

    def launch(trial_spec: JobSpec, key: str, trial_tags: dict[str, str], watcher: Watcher) -> TrainingResult:
        trial = replace(local, stop=watcher.halt, tags={**local.tags, **trial_tags})
        return train(trial_spec, dataset, data, key, trial, trial_objective=objective, pruned=watcher.settle)

    return run_trial(spec, sweep_run, slot, launch, lost=local.stop, of_lineage=lineage(spec, dataset.commit))


def close_sweep(spec: JobSpec, dataset: PinnedDataset, sweep_run: str) -> dict:
    """The sweep run's end: trials left running failed, the best trial on ``dataset`` chosen, the summary
    logged. The data validation that gated this run (in the sweep run's directory, not the trials') goes
    onto the best trial's MLflow run, which the model version and its card are made from."""
    from trainyard.sweeps.study import close
    from trainyard.tracking import mlflow_tracking as mt

    best = close(spec, dataset.commit, sweep_run)
    log_validation(mt.client(), best["trained"].mlflow_run_id, run_dir(spec, sweep_run))
    return best


def trained_job(
    spec: JobSpec, run_key: str, value: Mapping[str, Any] | TrainingResult
) -> tuple[JobSpec, TrainingResult]:
    """What the run ``run_key`` trained, for the steps after training: the JobSpec it trained with and the
    training's result (``training_result``'s XCom, which a user may write) held to the run
    (:func:`held_training`). A sweep run's is the trial its ``close_sweep`` chose, as the study keeps it
    (:func:`trainyard.sweeps.study.finished_trial`): the trial's own values and files (an earlier run of the
    sweep may have trained it), nothing of them from the XCom."""
    if spec.sweep is None:
        return spec, held_training(spec, run_key, value)
    from trainyard.sweeps.study import finished_trial

    return finished_trial(spec, run_key)
