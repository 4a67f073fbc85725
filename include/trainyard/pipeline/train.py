"""Stage 3, the training: the run's MLflow run and run config (:func:`plan_training`), the workers on this
machine (:func:`launch_local`) or in pods (the Airflow operators), and what they left, read as untrusted
(:func:`collect_training`): the result record, the curves relayed, the GPU time and cost of every try.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.pipeline.records import (
    PinnedDataset,
    PreparedData,
    TrainingPlan,
    TrainingResult,
    lineage_tags,
    metrics_folded,
    run_dir,
    tensorboard_dir,
)
from trainyard.spec import JobSpec, safe_key

if TYPE_CHECKING:
    import threading

    from trainyard.training.launchers.command import NodePlace
    from trainyard.training.launchers.local import Preemption

log = logging.getLogger(__name__)
PREEMPTIONS_TAG = "trainyard.preemptions"  # a run's MLflow tag: how often its training was preempted


@dataclass(frozen=True, eq=False)  # handed on, never compared or hashed (it holds a list, a callable, an event)
class LocalLaunch:
    """How a training runs on this machine, as its admission and its task say: where each output line goes
    (the task log; default: this process's log), the GPUs the job was given (its CUDA_VISIBLE_DEVICES;
    None leaves the environment's), the event that stops its workers (the job lost its admission), the
    word that it is preempted (its workers checkpoint and stop: Preempted), its wait in the queue, the tags
    of its MLflow run, and who is told of its plan before its workers start (the task, which links its
    MLflow run)."""

    on_line: Callable[[str], None] | None = None
    devices: list[str] | None = None
    stop: threading.Event | None = None
    preemption: Preemption | None = None  # the word that the job is preempted, and its workers' grace
    waited_s: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    on_plan: Callable[[TrainingPlan], None] | None = None
    node: NodePlace | None = None  # where this node stands among a multi-node job's (None: the job's only)


def in_pods(spec: JobSpec) -> bool:
    """A built-in trainer in Kubernetes pods: its packages are its image's, not this worker's."""
    return spec.backends.launcher == "kubernetes" and spec.recipe != "custom"


def start_tracking(spec: JobSpec, dataset: PinnedDataset, run_key: str, tags: dict[str, str] | None = None) -> str:
    """The run's MLflow run, with what it needs to be replayed: the dataset commit, the code version, the
    digest of the installed dependencies (the list as an artifact) and the whole spec (an artifact)."""
    from trainyard import environment
    from trainyard.spec import SPEC_DIGEST_TAG, spec_digest
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    dependencies = environment.installed()
    replayed: dict[str, str] = {}
    if spec.replay_of and in_pods(spec):  # the pods compare their image with the version's (training.entry)
        replayed = {"replay_of": spec.replay_of}
    elif spec.replay_of:  # here, where it trains, the environment must be the version's (or say how it is not)
        from trainyard import replay

        found = replay.check_environment(c, spec.replay_of, spec.replay_exact, mt.code_version(), dependencies)
        replayed = {"replay_of": spec.replay_of, replay.DIFFERENCES_TAG: found}
        if found != "none":
            log.warning("a replay in another environment than %s's (allowed):\n%s", spec.replay_of, found)
    run_id = mt.ensure_run(
        c,
        experiment=spec.name,
        run_key=run_key,
        run_name=safe_key(run_key),
        team=spec.resources.team,
        tags={
            **lineage_tags(dataset),
            environment.DEPENDENCIES_TAG: environment.digest(dependencies),
            SPEC_DIGEST_TAG: spec_digest(spec),  # a retraining job's memory of what it already tried
            **replayed,
            **(tags or {}),
        },
    )
    mt.log_params(
        c,
        run_id,
        spec.model_dump(mode="json", include={"recipe", "hyperparameters", "resources", "split", "recipe_options"}),
    )
    rdir = run_dir(spec, run_key)
    (rdir / "job_spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True))
    c.log_artifact(run_id, str(rdir / "job_spec.json"), "spec")
    (rdir / "dependencies.txt").write_text("\n".join(dependencies) + "\n")
    c.log_artifact(run_id, str(rdir / "dependencies.txt"), environment.DEPENDENCIES_ARTIFACT.rsplit("/", 1)[0])
    log_validation(c, run_id, rdir)
    return run_id


def log_validation(c, run_id: str, rdir: Path) -> None:
    """The data-validation report that ``validate_data`` left in the run directory ``rdir``, and its Data
    Docs (one site per suite), onto the MLflow run it gated."""
    if (rdir / "validation.json").exists():
        c.log_artifact(run_id, str(rdir / "validation.json"), "data_validation")
    for docs in sorted((rdir / "data_docs").glob("**/gx/uncommitted/data_docs")):
        suite = docs.relative_to(rdir / "data_docs").parts[0]
        c.log_artifacts(run_id, str(docs), "data_validation/data_docs" + ("" if suite == "gx" else f"/{suite}"))


def plan_training(
    spec: JobSpec,
    dataset: PinnedDataset,
    data: PreparedData,
    run_key: str,
    tags: dict[str, str] | None = None,
    trial_objective: str | None = None,
) -> TrainingPlan:
    """The MLflow run (with ``tags``) and the run config every launcher starts its workers with
    (idempotent). ``trial_objective``: a sweep trial's, reported by its workers at each epoch's end."""
    from trainyard.training.metrics import metrics_path
    from trainyard.training.run_config import RUN_CONFIG_FILE, RunConfig, work_dir

    out_dir = run_dir(spec, run_key)
    plan = TrainingPlan(
        config_path=str(out_dir / RUN_CONFIG_FILE),
        run_dir=str(out_dir),
        mlflow_run_id=start_tracking(spec, dataset, run_key, tags),
        tensorboard_dir=str(tensorboard_dir(spec, run_key)),
    )
    # The workers write in work/ only, and their metrics into a file there that the launcher relays: the
    # config they read names no tracking store (its URI may carry credentials)
    cfg = RunConfig(
        spec=spec,
        data=data,
        out_dir=work_dir(str(out_dir)),
        mlflow_run_id=plan.mlflow_run_id,
        tensorboard_dir=plan.tensorboard_dir,
        metrics_file=str(metrics_path(out_dir)),
        trial_objective=trial_objective,
        histogram_dir=str(Path(work_dir(str(out_dir))) / "tensorboard"),
        replay_dependencies=_version_trainer_dependencies(spec) if spec.replay_of and in_pods(spec) else None,
    )
    Path(cfg.out_dir).mkdir(exist_ok=True)
    cfg.dump(Path(plan.config_path))
    from trainyard.tracking import mlflow_tracking as mt

    mt.client().update_run(plan.mlflow_run_id, status="RUNNING")  # a retry's run is running again
    return plan


def _version_trainer_dependencies(spec: JobSpec) -> list[str]:
    """The dependency set the trainer of the version ``spec.replay_of`` had (:mod:`trainyard.replay`)."""
    from trainyard import replay
    from trainyard.tracking import mlflow_tracking as mt

    assert spec.replay_of is not None
    model, version = spec.replay_of.rsplit(":", 1)
    return replay.trainer_dependencies(replay.recorded(mt.client(), model, version))


def launch_local(spec: JobSpec, data: PreparedData, plan: TrainingPlan, local: LocalLaunch | None = None) -> None:
    """The strategy's launcher (torchrun, horovodrun, deepspeed; or the custom command under torchrun) as a
    subprocess, as ``local`` says (:class:`LocalLaunch`). The launcher records this try's GPU time in the
    run's usage file, failed tries included."""
    _launch(spec, data, plan.run_dir, plan.config_path, local or LocalLaunch())


def _launch(spec: JobSpec, data: PreparedData, run_dir: str, config_path: str, local: LocalLaunch) -> None:
    """The workers of this machine's node, as ``local`` says (every node's task: node 0 through a plan)."""
    from trainyard.training.launchers import local as launcher

    launcher.launch(
        spec,
        data,
        run_dir=run_dir,
        config_path=config_path,
        on_line=local.on_line or (lambda line: log.info("%s", line)),
        devices=local.devices,
        stop=local.stop,
        preemption=local.preemption,
        node=local.node,
    )


def train_node(spec: JobSpec, data: PreparedData, run_key: str, local: LocalLaunch) -> None:
    """One of a multi-node training's other nodes (``local.node``, not 0): its workers, peers of node 0's,
    on this machine. Node 0's task plans the run (its MLflow run and run config), relays the metrics and
    collects the result; this node records its own GPU time. Node 0 says where its rendezvous is before it
    plans, but no worker of any node starts before node 0's torchrun, started after the plan, has joined
    the rendezvous: the run config is there when this node's workers read it."""
    from trainyard.training.run_config import RUN_CONFIG_FILE

    assert local.node is not None and local.node.index > 0
    out_dir = run_dir(spec, run_key)
    _launch(spec, data, str(out_dir), str(out_dir / RUN_CONFIG_FILE), local)


def collect_training(
    spec: JobSpec, plan: TrainingPlan, result: bool = True, waited_s: float | None = None, stopped: bool = False
) -> TrainingResult:
    """What the workers left, as a :class:`TrainingResult`: train_result.json (built-in recipes) or the
    custom metrics file, their metrics not relayed to MLflow yet; plus the GPU time of every try (the
    launchers' usage records: a retry adds to it, queue time is not in it) and its cost. ``result=False``:
    the curves, time and cost only (a sweep trial its pruner stopped left no model). ``waited_s``: the
    job's wait in the queue, logged as ``queue_wait_seconds``. ``stopped``: the workers were killed, so a
    last line without its newline was cut off, not finished."""
    from trainyard.scheduling.resources import resources_in_force, run_cost
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.training import custom, metrics, usage

    out_dir = Path(plan.run_dir)
    c = mt.client()
    relay_final = not stopped
    metrics.relay(out_dir, c, plan.mlflow_run_id, plan.tensorboard_dir, on_line=log.info, final=relay_final)
    metrics.copy_histograms(out_dir, plan.tensorboard_dir)
    if spec.recipe != "custom":  # a custom program's files say nothing the platform may record as its own
        _record_trainer_environment(c, plan.mlflow_run_id, out_dir)
    found = {} if not result else custom.collect(out_dir) if spec.recipe == "custom" else built_in_result(out_dir)
    gpu_seconds = usage.gpu_seconds(out_dir)
    tries = usage.tries(out_dir)
    cost = run_cost(resources_in_force(), spec.resources.slot_type, gpu_seconds)
    record = _result_record(  # before the run is marked finished: workers' values of the wrong type fail it
        found,
        **plan.model_dump(include={"mlflow_run_id", "run_dir", "tensorboard_dir"}),
        wall_seconds=round(usage.wall_seconds(out_dir), 3),
        gpu_seconds=round(gpu_seconds, 3),
        tries=len(tries),
        cost=cost,
    )
    log.info(
        "GPU time %.1f GPU-seconds over %d tr%s on %s: cost %.4f",
        gpu_seconds,
        len(tries),
        "y" if len(tries) == 1 else "ies",
        spec.resources.slot_type,
        cost,
    )
    c.log_metric(plan.mlflow_run_id, "gpu_seconds", gpu_seconds)
    c.log_metric(plan.mlflow_run_id, "run_cost", cost)
    if waited_s is not None:
        c.log_metric(plan.mlflow_run_id, "queue_wait_seconds", waited_s)
    c.set_terminated(plan.mlflow_run_id, "FINISHED" if result else "KILLED")  # KILLED: stopped by a pruner
    return record


def _result_record(found: dict, **platform) -> TrainingResult:
    """The record of what the workers left (``found``: :func:`built_in_result`'s or ``custom.collect``'s,
    already held to their shapes; empty for a pruned trial) and of what the platform measured: a built-in
    recipe's val_* metrics and a custom program's final metrics both become ``final_metrics``. A value of
    the workers' of the wrong type is a WorkerOutputError."""
    from pydantic import ValidationError

    from trainyard.training.run_config import WorkerOutputError

    try:
        return TrainingResult(**metrics_folded(found), **platform)
    except ValidationError as err:
        wrong = sorted({".".join(map(str, e["loc"]))[:80] for e in err.errors()})
        raise WorkerOutputError(
            f"{platform['run_dir']}: the workers' result does not fit the training's record: {', '.join(wrong[:10])} "
            "of the wrong type"
        ) from None


TRAINER_RECORD_LIMIT = 1 << 20  # bytes of the trainer's dependency list read: a few hundred lines


def _record_trainer_environment(c, run_id: str, out_dir: Path) -> None:
    """The built-in trainer's own dependency set (a pod's is its image's) on the run: artifact
    ``environment/trainer_dependencies.txt`` and its digest as a tag; and how a replay allowed to differ
    differed where it trained (a pod's check). Written by the workers, so read as untrusted: a list that is
    not ``name==version`` lines is logged and not recorded."""
    from trainyard import environment, replay
    from trainyard.training.entry import REPLAY_DIFFERENCES_FILE
    from trainyard.training.run_config import open_untrusted, work_dir

    work = Path(work_dir(str(out_dir)))
    texts = {}
    for name in (environment.TRAINER_FILE, REPLAY_DIFFERENCES_FILE):
        with open_untrusted(work / name) as fd:
            if fd is not None:
                texts[name] = os.pread(fd, TRAINER_RECORD_LIMIT + 1, 0).decode("utf-8", "replace")
    listed = texts.get(environment.TRAINER_FILE)
    if listed is not None:
        lines = listed.split()
        if len(listed) > TRAINER_RECORD_LIMIT or not all(environment.REQUIREMENT_LINE.fullmatch(x) for x in lines):
            log.warning("%s is not a list of name==version lines: not recorded", work / environment.TRAINER_FILE)
        else:
            record = out_dir / environment.TRAINER_FILE
            record.write_text("\n".join(lines) + "\n")
            c.log_artifact(run_id, str(record), environment.TRAINER_ARTIFACT.rsplit("/", 1)[0])
            c.set_tag(run_id, environment.TRAINER_TAG, environment.digest(lines))
    differed = texts.get(REPLAY_DIFFERENCES_FILE)
    if differed is not None:
        c.set_tag(run_id, replay.DIFFERENCES_TAG, differed.strip()[: replay.TAG_LIMIT] or "none")


RESULT_LIMIT = 1 << 20  # bytes of train_result.json read: a result record is a few hundred


RESULT_FIELDS = {
    "recipe",
    "steps",
    "epochs",
    "world_size",
    "strategy",
    "train_seconds",
    "resumed_from_step",
    "samples_per_second",
    "loop_seconds",
    "checkpoint_stall_seconds",
    "checkpoints",
}


def built_in_result(out_dir: Path) -> dict:
    """The result record rank 0 wrote (``work/train_result.json``), read as untrusted: a JSON object of
    plain values under plain names, with the model at the one place the platform expects it, a regular
    file of its own."""
    import re

    from trainyard.training.run_config import WorkerOutputError, open_untrusted, output_file, work_dir

    path = Path(work_dir(str(out_dir))) / "train_result.json"
    with open_untrusted(path) as fd:
        if fd is None:
            raise FileNotFoundError(f"{path}: the workers ended without their result record")
        raw = os.pread(fd, RESULT_LIMIT + 1, 0)
    try:
        result = json.loads(raw) if len(raw) <= RESULT_LIMIT else None
    except ValueError:
        result = None
    plain = (str, int, float, bool, type(None))
    if not isinstance(result, dict) or not all(
        re.fullmatch(r"[a-z][a-z0-9_]{0,63}", k) and isinstance(v, plain) for k, v in result.items()
    ):
        raise WorkerOutputError(f"{path}: expected a JSON object of plain values (at most {RESULT_LIMIT} bytes)")
    # what the loop writes (trainyard.training.loop.finish) and the recipe's val_* metrics, nothing else
    result = {k: v for k, v in result.items() if k in RESULT_FIELDS or k.startswith("val_")}
    model = output_file(out_dir, "model.pt")
    if model is None:
        raise FileNotFoundError(f"{path.parent / 'model.pt'}: the workers ended without writing the model")
    return {**result, "model_path": str(model)}


def train(
    spec: JobSpec,
    dataset: PinnedDataset,
    data: PreparedData,
    run_key: str,
    local: LocalLaunch | None = None,
    trial_objective: str | None = None,
    pruned: Callable[[], bool] = lambda: False,
) -> TrainingResult:
    """Local training in one step: plan (the MLflow run, with ``local``'s tags), launch on this machine as
    ``local`` says, collect (with its wait in the queue). Resumes from the run's newest checkpoint, so a
    retry continues instead of starting over. A sweep trial's workers report ``trial_objective`` each
    epoch; where ``pruned()``, asked once the workers have ended, says the pruner stopped them, only their
    curves, time and cost are collected."""
    from trainyard.training.launchers.local import WorkersStopped

    local = local or LocalLaunch()
    plan = plan_training(spec, dataset, data, run_key, dict(local.tags), trial_objective)
    with _failed_run_on_error(plan):  # a collect that fails leaves no run RUNNING either
        if local.on_plan:
            local.on_plan(plan)
        try:
            launch_local(spec, data, plan, local)
            stopped = False
        except WorkersStopped:
            if not pruned():
                raise
            # the pruner's word, then the stop, ended them (they did not end of themselves): pruned all the same
            log.info("sweep: the trial's workers were stopped after the pruner's word")
            stopped = True
        was_pruned = pruned()  # asked once the workers have ended: the answer holds from here on
        return collect_training(spec, plan, result=not was_pruned, waited_s=local.waited_s, stopped=stopped)


@contextlib.contextmanager
def _failed_run_on_error(plan: TrainingPlan) -> Iterator[None]:
    """The MLflow run of a training whose workers failed is marked FAILED (a retry marks it RUNNING); one
    that was preempted SCHEDULED (it trains on once admitted again), with the count of its preemptions."""
    from trainyard.errors import Preempted

    try:
        yield
    except BaseException as err:
        from trainyard.tracking import mlflow_tracking as mt

        with contextlib.suppress(Exception):  # the training's own error is the one to report
            c = mt.client()
            if isinstance(err, Preempted):
                run = c.get_run(plan.mlflow_run_id)
                count = int(run.data.tags.get(PREEMPTIONS_TAG, "0")) + 1
                c.set_tag(plan.mlflow_run_id, PREEMPTIONS_TAG, str(count))
                c.update_run(plan.mlflow_run_id, status="SCHEDULED")
            else:
                c.set_terminated(plan.mlflow_run_id, "FAILED")
        raise
