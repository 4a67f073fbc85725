"""One sweep trial, inside the training task that runs it: asked from the study, trained as a job of its
own (its run directory, MLflow run and curves), stopped early by the pruner, and told how it ended.

A slot (the sweep's mapped training task) runs one trial per try. A retry's first act is to fail the
trial its earlier try left RUNNING: that try's process is gone (killed, or its worker was), and the study
must not count a trial as running forever. The retry then asks a new trial, with new values.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard import recipes
from trainyard.pipeline.records import TrainingResult
from trainyard.spec import JobSpec
from trainyard.sweeps.study import (
    ALIVE_ATTR,
    ALIVE_EVERY_S,
    FAILED_ATTR,
    LINEAGE_ATTR,
    RUN_ATTR,
    SLOT_ATTR,
    SPEC_ATTR,
    TRAINED_ATTR,
    SweepError,
    ask_lock,
    fail_left_running,
    open_study,
    queue_grid_point,
    sampler,
    suggest,
    tell,
    with_values,
)
from trainyard.sweeps.summary import write_hparams
from trainyard.training import handshake
from trainyard.training.run_config import WorkerOutputError, open_untrusted

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the watcher reads the workers' reports
GRACE_S = 60.0  # how long workers told to stop may take before they are stopped
REPORTS_LIMIT = 1 << 20  # bytes of reports read: a line per epoch
WATCH_READ = 1 << 20  # bytes of a custom program's metrics file read per look
MAX_POINTS = 100_000  # reporting points of a trial (a report per epoch; hyperparameters.epochs is at most 1000)


def trial_key(sweep_run: str, number: int) -> str:
    """The run key of trial ``number``: its run directory and MLflow run."""
    return f"{sweep_run}/trial-{number}"


class Watcher:
    """``with Watcher(trial, work_dir, lost) as w:`` while the trial's workers run: reads their reports
    (:mod:`trainyard.training.handshake`), reports each epoch's objective to the trial, asks the pruner and
    answers. ``w.halt`` is the event to stop the workers with: set when ``lost`` is (the job lost its
    admission), when a trial told to stop is still running ``grace_s`` later, or when the reports are
    malformed (``w.error``). ``w.pruned_at``: the epoch after which the pruner stopped the trial.

    ``objective_in_metrics``: a custom program's trial, whose reports are the lines of its metrics file
    holding that metric (:mod:`trainyard.training.custom`: the n-th such line with a new step is
    reporting point n, at most ``max_points`` of them); the answers go to the same verdict file.

    :meth:`settle` (once the workers have ended) fixes whether the trial was pruned: later looks report
    what they find to the trial, but decide nothing."""

    def __init__(
        self,
        trial: optuna.Trial,
        work_dir: str | Path,
        lost: threading.Event | None = None,
        grace_s: float | None = None,
        poll_s: float = POLL_S,
        objective_in_metrics: str | None = None,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.trial, self.work = trial, Path(work_dir)
        self.lost, self.poll_s = lost, poll_s
        self.grace_s = GRACE_S if grace_s is None else grace_s
        self.objective_in_metrics, self.max_points = objective_in_metrics, max_points
        self._last_step, self._points = -1, 0  # the metrics line of the last reporting point: its step, number
        self._inode: int | None = None  # of the metrics file read: a file replaced under it is read anew
        self._settled = False
        self.halt = threading.Event()
        self.overstayed = False  # the workers were stopped because they went on after being told to stop
        self.pruned_at: int | None = None
        self.reported: dict[int, float] = {}
        self.error: Exception | None = None
        self._offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._settled = True
        if self.error is None:
            with contextlib.suppress(Exception):
                self._pass(answer=False)  # what rank 0 reported last, after the thread's last look

    def settle(self) -> bool:
        """The workers have ended: whether the pruner stopped the trial, fixed from now on (a report read
        later is recorded, not judged); False where the workers' reports failed the trial (``error``)."""
        self._settled = True
        return self.pruned_at is not None and self.error is None

    def _run(self) -> None:
        stop_by: float | None = None
        alive = 0.0
        while not self._done.wait(self.poll_s):
            if time.monotonic() - alive > ALIVE_EVERY_S:  # the study's sign that this trial still trains
                alive = time.monotonic()
                with contextlib.suppress(Exception):
                    self.trial.set_user_attr(ALIVE_ATTR, time.time())
            if self.lost is not None and self.lost.is_set():
                self.halt.set()
            try:
                self._pass(answer=True)
            except Exception as err:  # noqa: BLE001 - raised by the task once the workers are stopped
                self.error = err
                self.halt.set()
                return
            if self.pruned_at is not None:
                stop_by = stop_by or time.monotonic() + self.grace_s
                if time.monotonic() > stop_by and not self.halt.is_set():
                    log.warning("the trial's workers did not stop %.0fs after being told: stopping them", self.grace_s)
                    self.overstayed = True
                    self.halt.set()

    def _pass(self, answer: bool) -> None:
        for epoch, value in self._new_reports():
            if epoch in self.reported or self.pruned_at is not None:
                # a worker restarted by torchrun reports its epochs again; one told to stop that goes on
                # reports past the trial's end: answered, not reported
                prune = self.pruned_at is not None
            else:
                if len(self.reported) >= self.max_points:
                    raise WorkerOutputError(
                        f"{self.work}: more than {self.max_points} reporting points of the objective (report it "
                        "once per epoch, at most hyperparameters.epochs times)"
                    )
                self.reported[epoch] = value
                self.trial.report(value, epoch)
                prune = not self._settled and bool(self.trial.should_prune())
                if prune and self.pruned_at is None:
                    self.pruned_at = epoch
                    log.info("sweep: the pruner stops trial %d after epoch %d (%s)", self.trial.number, epoch, value)
            if answer:
                handshake.write_verdict(self.work, epoch, prune)

    def _new_reports(self) -> Iterator[tuple[int, float]]:
        """(reporting point, objective) of each complete line written since the last look, in order (a
        malformed line raises once the ones before it are given)."""
        if self.objective_in_metrics is not None:
            yield from self._metrics_reports(self.objective_in_metrics)
            return
        path = self.work / handshake.REPORTS
        with open_untrusted(path) as fd:
            if fd is None:
                return
            if os.fstat(fd).st_size > REPORTS_LIMIT:
                raise WorkerOutputError(f"{path}: more than {REPORTS_LIMIT} bytes of reports (a line an epoch)")
            chunk = os.pread(fd, REPORTS_LIMIT - self._offset, self._offset)
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            yield _report(line, path)

    def _metrics_reports(self, objective: str) -> Iterator[tuple[int, float]]:
        """One chunk of the metrics file a look (so that a stop, a lost lease or the grace is seen between
        chunks however fast the program writes); a file replaced or cut short is read from its start
        again, its repeated steps answered, not reported."""
        from trainyard.training.metrics import METRICS_FILE, parse_line

        path = self.work / METRICS_FILE
        with open_untrusted(path) as fd:
            if fd is None:
                return
            st = os.fstat(fd)
            if st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset = st.st_ino, 0
            chunk = os.pread(fd, WATCH_READ, self._offset)
        end = chunk.rfind(b"\n") + 1
        if end == 0 and len(chunk) == WATCH_READ:
            raise WorkerOutputError(f"{path}: a line longer than {WATCH_READ} bytes")
        at, self._offset = self._offset, self._offset + end
        for line in chunk[: max(end - 1, 0)].split(b"\n") if end else []:
            where, at = f"{path} (the line at byte {at})", at + len(line) + 1
            if not line.strip():
                continue
            step, points = parse_line(line, where)
            value = dict(points).get(objective)
            if value is None:
                continue
            if step > self._last_step:
                self._last_step, self._points = step, self._points + 1
                yield self._points, value
            elif self._points:  # a program restarted from a checkpoint reports again: answered again
                yield self._points, value


def _report(line: bytes, path: Path) -> tuple[int, float]:
    try:
        record = json.loads(line)
        epoch, value = int(record["epoch"]), record["value"]
        value = float("nan") if value is None else float(value)
    except (ValueError, KeyError, TypeError, OverflowError) as err:
        raise WorkerOutputError(f"{path}: expected {{'epoch': int, 'value': float}} per line ({err})") from None
    if not 1 <= epoch <= 100_000:
        raise WorkerOutputError(f"{path}: epoch {epoch} is out of range")
    return epoch, value


def constraint_violations(spec: JobSpec, result: dict) -> dict[str, float]:
    """Per constraint of the sweep (``constraints[i]:metric``): how far the trial's result misses it (> 0),
    or <= 0 when met; a metric the result lacks misses by 1."""
    assert spec.sweep is not None
    out = {}
    for i, c in enumerate(spec.sweep.constraints):
        value = result.get(c.metric)
        key = f"constraints[{i}]:{c.metric}"
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            out[key] = 1.0
            continue
        miss = [c.min - value if c.min is not None else -math.inf, value - c.max if c.max is not None else -math.inf]
        out[key] = float(max(miss))
    return out


def _ask(study: optuna.Study, spec: JobSpec, attrs: dict[str, str]) -> tuple[optuna.Trial, dict[str, Any]]:
    """A new trial of the study, with ``attrs`` and its values drawn. One ask at a time per study: a trial's
    values are drawn seeing every trial asked before it, running ones included (TPE's constant liar; a
    grid's next point is chosen knowing every point taken)."""
    import optuna

    assert spec.sweep is not None
    sweep = spec.sweep
    with ask_lock(spec.resources.team, sweep.name):
        if sweep.sampler == "grid":
            queue_grid_point(study, sweep)
        study.sampler = sampler(sweep, asked=len(study.get_trials(deepcopy=False)))
        trial = study.ask()
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        trial.set_user_attr(ALIVE_ATTR, time.time())
        try:
            return trial, {p.name: suggest(trial, p) for p in sweep.parameters}
        except BaseException:
            tell(study, trial, state=optuna.trial.TrialState.FAIL)
            raise


def _complete(study: optuna.Study, trial: optuna.Trial, spec: JobSpec, result: TrainingResult) -> float:
    """Tell the study that ``trial`` completed with the objective ``result`` measured (and how far it missed
    each constraint); SweepError if it measured no finite objective."""
    assert spec.sweep is not None
    objective = spec.sweep.objective
    # the last reports (a built-in recipe's val_* metrics, a custom program's own) and the loop's figures
    measured = {**result.final_metrics, **result.model_dump(exclude={"final_metrics"}, exclude_none=True)}
    value = measured.get(objective)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        where = (
            " (a custom program reports it in its metrics file, once per epoch: trainyard.training.custom)"
            if spec.recipe == "custom"
            else ""
        )
        raise SweepError(f"trial {trial.number} ended without a finite {objective} (got {value!r}){where}")
    for key, violation in constraint_violations(spec, measured).items():
        trial.set_constraint(key, violation)
    trial.set_user_attr(TRAINED_ATTR, result.model_dump(mode="json"))  # read back by study.trained_of
    tell(study, trial, float(value))
    return value


def run_trial(
    spec: JobSpec,
    sweep_run: str,
    slot: int,
    train: Callable[[JobSpec, str, dict[str, str], Watcher], TrainingResult],
    lost: threading.Event | None = None,
    of_lineage: str = "",
) -> dict:
    """Ask the study for a trial, train it with ``train(trial_spec, trial_run_key, tags, watcher)`` (which
    stops the workers once ``watcher.halt`` is set and returns the collected result, the curves only once
    ``watcher.pruned_at`` is set)
    and tell the study how it ended: COMPLETE with the objective, PRUNED (its checkpoints removed) or FAIL
    (the error is raised again). ``lost``: set when the job lost its admission (the workers stop);
    ``of_lineage``: the run's :func:`~trainyard.sweeps.study.lineage`, recorded with the trial."""
    import optuna

    assert spec.sweep is not None
    sweep = spec.sweep
    study = open_study(spec)
    slot_key = f"{sweep_run}#{slot}"
    gone = fail_left_running(study, sweep_run, slot_key, why="its task's try ended without finishing it")
    if gone:
        log.warning("trial(s) %s, left running by an earlier try of this task, failed", gone)
    trial, values = _ask(study, spec, {RUN_ATTR: sweep_run, SLOT_ATTR: slot_key, LINEAGE_ATTR: of_lineage})
    try:
        trial_spec = with_values(spec, values).model_copy(update={"sweep": None})
        recipes.check_spec(trial_spec)  # values inside the ranges too (the first task checked their ends)
        trial.set_user_attr(SPEC_ATTR, trial_spec.model_dump(mode="json"))
        log.info("sweep %s: trial %d of slot %d with %s", sweep.name, trial.number, slot, values)
        key = trial_key(sweep_run, trial.number)
        tags = {"sweep.name": sweep.name, "sweep.trial": str(trial.number), "sweep.run": sweep_run}
        run_dir = trial_run_dir(trial_spec, key)
        in_metrics = sweep.objective if spec.recipe == "custom" else None  # a custom program reports no other way
        epochs = trial_spec.hyperparameters.epochs
        with Watcher(trial, run_dir / "work", lost, objective_in_metrics=in_metrics, max_points=epochs) as watcher:
            try:
                result = train(trial_spec, key, tags, watcher)
            except Exception:
                if watcher.error is not None:  # the workers were stopped for it
                    raise watcher.error from None
                raise
        if watcher.error is not None:
            raise watcher.error
        if watcher.pruned_at is not None:
            shutil.rmtree(run_dir / "work" / "checkpoints", ignore_errors=True)
            tell(study, trial, state=optuna.trial.TrialState.PRUNED)
            _hparams(result, values, sweep.objective, "pruned")
            return {
                "trial": trial.number,
                "state": "pruned",
                "pruned_at_epoch": watcher.pruned_at,
                "params": values,
                "reported": watcher.reported,
                **_where(result),
            }
        value = _complete(study, trial, spec, result)
        _hparams(result, values, sweep.objective, "complete")
        return {"trial": trial.number, "state": "complete", "value": value, "params": values, **_where(result)}
    except BaseException as err:
        with contextlib.suppress(Exception):
            trial.set_user_attr(FAILED_ATTR, f"{type(err).__name__}: {err}"[:1000])
        with contextlib.suppress(Exception):  # a trial already told stays as it was told
            tell(study, trial, state=optuna.trial.TrialState.FAIL)
        raise


def _where(result: TrainingResult) -> dict:
    """Where the trial's run is (its MLflow run, TensorBoard directory): the task's links read them."""
    return result.model_dump(include={"mlflow_run_id", "tensorboard_dir"})


def _hparams(result: TrainingResult, values: dict, objective: str, state: str) -> None:
    """The trial in TensorBoard's HParams view; a failure to write it is logged, the trial stands."""
    if not result.tensorboard_dir:
        return
    try:
        write_hparams(result.tensorboard_dir, values, objective, state)
    except Exception:  # noqa: BLE001 - a view, not the trial's outcome
        log.warning("could not write the trial's hparams for TensorBoard", exc_info=True)


def trial_run_dir(spec: JobSpec, key: str) -> Path:
    from trainyard import paths

    return paths.run_dir(spec.name, key)
