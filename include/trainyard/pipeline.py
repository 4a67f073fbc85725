"""The steps of train_pipeline as plain functions: a validated JobSpec and JSON-able manifests in,
JSON-able manifests out.

The DAG only wires these together (turning each spec XCom back into a JobSpec once); tests and the CLI
call them directly. Every step reads pinned inputs (a dataset commit, a model file) and writes under a key
derived from them, so re-running a step never duplicates anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard import paths
from trainyard.errors import PermanentError
from trainyard.export.onnx_export import ExportFailed
from trainyard.spec import JobSpec, SpecError, parse_spec, safe_key

if TYPE_CHECKING:
    import threading

    from trainyard.recipes.base import Recipe
    from trainyard.scheduling.budgets import TeamMonth
    from trainyard.scheduling.resources import ResourcesConfig

log = logging.getLogger(__name__)


class DataValidationError(PermanentError):
    """The dataset failed its expectation suite; the message lists every failed expectation."""


def run_dir(spec: JobSpec, run_key: str) -> Path:
    return paths.run_dir(spec.name, run_key)


# -- 1. spec ---------------------------------------------------------------------------------------------
def validate_spec(raw: dict, user: str | None = None, audit: bool = True, pipeline_team: str | None = None) -> JobSpec:
    """Parse and check a raw spec (Params merged with conf); raise SpecError naming every bad field.
    ``user``: who triggered the run, who must be a member of its team (None: no person did). ``audit``:
    a refusal by the team's policy is an entry of the audit trail (a run's first task); a check of a file
    (``trainyard validate``) writes nothing. ``pipeline_team``: the team whose own training DAG runs the
    job (None: the one DAG of every team), which must be the job's."""
    from trainyard import recipes
    from trainyard.scheduling.budgets import check_budget
    from trainyard.scheduling.resources import check_spec, load_resources
    from trainyard.sweeps.check import check_sweep
    from trainyard.teams import check_member, check_pipeline_team, check_policy
    from trainyard.training.strategies.precision import check_precision

    spec = parse_spec(raw)
    fleet = load_resources()
    check_spec(spec, fleet)
    try:
        check_pipeline_team(spec.resources.team, pipeline_team)
        check_member(spec, fleet, user)
        check_policy(spec, fleet)
    except SpecError as err:  # who tried what, in the audit trail
        if audit:
            from trainyard.audit import AuditLog

            AuditLog().append("policy_refusal", user or "scheduler", team=spec.resources.team, refused=str(err))
        raise
    check_budget(spec, fleet, team_standing(fleet, spec.resources.team))
    recipes.check_spec(spec)
    check_sweep(spec, fleet)
    # On Kubernetes the pods get GPUs exactly when the job names a GPU type, so a precision they cannot do
    # is refused here, before any data moves. A local job's workers use whatever CUDA devices this machine
    # has, which only the workers see (this step does not import torch): they refuse it, naming the field.
    if spec.backends.launcher == "kubernetes":
        check_precision(spec, cuda=spec.resources.gpu_type != "cpu")
    return spec


def check_worker(spec: JobSpec) -> None:
    """What the worker that runs the job must offer, checked on it before any data moves: a local custom
    command needs the sandbox (SandboxUnavailable, saying why, where there is none). Apart from
    validate_spec, which also runs where the job is only written (``trainyard validate``)."""
    if spec.recipe == "custom" and spec.backends.launcher == "local":
        from trainyard.training.launchers.sandbox import require

        require()


def check_ownership(spec: JobSpec, client=None, *, claim: bool = False) -> None:
    """Refuse a job that would register into a model, or log into an MLflow experiment, another team owns,
    naming the owner (:mod:`trainyard.registry.ownership`, :func:`trainyard.teams.check_owner`). Checked by
    the run's first task, before any data moves, and again by ``register`` with ``claim``: a model no team
    owns yet is then made, owned by the job's team. A replay registers nothing."""
    if spec.replay_of is not None:
        return
    from trainyard.registry import ownership
    from trainyard.teams import check_owner
    from trainyard.tracking import mlflow_tracking as mt

    c = client or mt.client()
    team = spec.resources.team
    check_owner(spec.name, ownership.claim(c, spec.name, team) if claim else ownership.owner(c, spec.name), team)
    check_owner(spec.name, mt.experiment_owner(c, spec.name), team, what="MLflow experiment")


def team_standing(fleet: ResourcesConfig, team: str, month: str | None = None) -> TeamMonth:
    """The team's spend and commitments this month (or ``month``), from this host's run records and
    admission ledger."""
    import time

    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.budgets import month_of, team_months

    month = month or month_of(time.time())
    return team_months(fleet, month, paths.runs_root(), existing_ledger(fleet))[team]


# -- 2. data -----------------------------------------------------------------------------------------------
def _store(kind: str):
    from trainyard.data.stores import open_store

    return open_store(kind)


def resolve_dataset(spec: JobSpec) -> dict:
    """Ingest the built-in source if the spec names one, then pin the ref to an immutable commit id."""
    from trainyard.data.store import tree_digest
    from trainyard.datasets import check_job_access

    ds = spec.dataset
    store = _store(ds.store)
    check_job_access(store, spec)
    if ds.source != "none":
        commit = _data_recipe(spec).ingest(ds.source, store, ds.repo, branch="main")
        log.info("ingested built-in source %s into %s: commit %s", ds.source, ds.repo, commit.id)
    commit_id = store.resolve(ds.repo, ds.ref)
    entries = store.list(ds.repo, commit_id)
    digest, files = tree_digest(entries), len(entries)
    log.info("dataset %s@%s pinned to commit %s (%d files, digest %s)", ds.repo, ds.ref, commit_id, files, digest[:12])
    return {"store": store.kind, "repo": ds.repo, "ref": ds.ref, "commit": commit_id, "digest": digest, "files": files}


def pinned_dataset(spec: JobSpec, dataset: dict) -> dict:
    """A later task's copy of ``resolve_dataset``'s result (an XCom, which a user may write), held to the
    job: the store and repository its spec names, at a commit id (not a branch), in a repository its team
    may read. Returns it; NotAllowed naming what differs."""
    from trainyard.data.store import COMMIT_RE
    from trainyard.datasets import check_read
    from trainyard.teams import NotAllowed

    ds = spec.dataset
    where = f"{dataset.get('store')}:{dataset.get('repo')}@{str(dataset.get('commit'))[:64]}"
    if (dataset.get("store"), dataset.get("repo")) != (ds.store, ds.repo) or not COMMIT_RE.fullmatch(
        str(dataset.get("commit"))
    ):
        raise NotAllowed(
            f"the dataset this task was handed ({where}) is not the job's ({ds.store}:{ds.repo} at a commit id): "
            "resolve_dataset's result was changed; trigger the job again"
        )
    check_read(_store(ds.store), ds.repo, [spec.resources.team], admin=False)
    return dataset


def own_run_files(spec: JobSpec, result: dict) -> dict:
    """A step's result (``train``'s, ``export_onnx``'s: an XCom, which a user may write) held to the job:
    every file it names (``run_dir``, ``*_path``, ``input_example``, ``artifacts``) inside the job's own runs
    folder (``runs/<name>/``: a job name is its team's), and its MLflow run (``mlflow_run_id``) one of the
    job's experiment. Returns it; NotAllowed naming what is not the job's."""
    from trainyard.teams import NotAllowed

    root = (paths.runs_root() / spec.name).resolve()
    files = [v for k, v in result.items() if k in ("run_dir", "input_example") or k.endswith("_path")]
    files += list((result.get("artifacts") or {}).values())
    for file in (f for f in files if f):
        if root not in Path(str(file)).resolve().parents:
            raise NotAllowed(
                f"{file} is not a file of job {spec.name!r} (its runs are under {root}): this task's input was "
                "changed; trigger the job again"
            )
    if result.get("mlflow_run_id"):
        from trainyard.tracking import mlflow_tracking as mt

        c = mt.client()
        experiment = c.get_experiment(c.get_run(str(result["mlflow_run_id"])).info.experiment_id).name
        if experiment != spec.name:
            raise NotAllowed(
                f"MLflow run {result['mlflow_run_id']} is one of {experiment!r}, not of job {spec.name!r}: this "
                "task's input was changed; trigger the job again"
            )
    return result


def checkout(dataset: dict) -> Path:
    """The commit's files on local disk (immutable, so cached by commit id)."""
    dest = paths.cache_root() / "checkouts" / dataset["repo"] / dataset["commit"]
    return _store(dataset["store"]).export(dataset["repo"], dataset["commit"], dest)


def _data_recipe(spec: JobSpec) -> Recipe:
    """The recipe whose data layout the job uses; a custom command gets the image-classification one."""
    from trainyard import recipes

    return recipes.get("digits_cnn" if spec.recipe == "custom" else spec.recipe)


def validate_data(spec: JobSpec, dataset: dict, run_key: str) -> dict:
    """The recipe's expectation suites over the pinned commit; Data Docs kept with the run."""
    report = _data_recipe(spec).validate(checkout(dataset), run_dir(spec, run_key) / "data_docs")
    out = run_dir(spec, run_key) / "validation.json"
    out.write_text(json.dumps(report.to_dict(), indent=1, default=str))
    log.info("%s (report: %s, data docs: %s)", report.summary(), out, report.docs)
    if not report.success:
        raise DataValidationError(
            f"dataset {dataset['repo']}@{dataset['commit'][:12]} failed validation, "
            f"training skipped.\n{report.summary()}"
        )
    return {"success": True, "report": str(out), "docs": report.docs, "checks": len(report.checks)}


def prepare_data(spec: JobSpec, dataset: dict) -> dict:
    """Hash split of the commit, written as the recipe's records in LMDB or TFRecord (cached)."""
    from trainyard.data.prepare import prepare_records

    split = spec.split
    recipe = _data_recipe(spec)
    options = recipe.opts(spec)  # a custom job has none (validate_spec): the data recipe's defaults
    manifest = prepare_records(
        lambda: recipe.samples(checkout(dataset), options),
        dataset["commit"],
        paths.cache_root() / "prepared",
        split.val_fraction,
        split.seed,
        fmt=spec.dataset.format,
        test_fraction=split.test_fraction,
        variant=recipe.variant(options),
    )
    log.info(
        "prepared %s (%s): %s", manifest["path"], "cache hit" if manifest["cached"] else "built", manifest["counts"]
    )
    return manifest


# -- 3. training -------------------------------------------------------------------------------------------
def in_pods(spec: JobSpec) -> bool:
    """A built-in trainer in Kubernetes pods: its packages are its image's, not this worker's."""
    return spec.backends.launcher == "kubernetes" and spec.recipe != "custom"


def start_tracking(spec: JobSpec, dataset: dict, run_key: str, tags: dict[str, str] | None = None) -> str:
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
            "dataset.store": dataset["store"],
            "dataset.repo": dataset["repo"],
            "dataset.commit": dataset["commit"],
            "dataset.digest": dataset["digest"],
            "code_version": mt.code_version(),
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
    dataset: dict,
    data: dict,
    run_key: str,
    tags: dict[str, str] | None = None,
    trial_objective: str | None = None,
) -> dict:
    """The MLflow run (with ``tags``) and the run config every launcher starts its workers with
    (idempotent). ``trial_objective``: a sweep trial's, reported by its workers at each epoch's end."""
    from trainyard.training.metrics import metrics_path
    from trainyard.training.run_config import RUN_CONFIG_FILE, RunConfig, work_dir

    out_dir = run_dir(spec, run_key)
    # The workers write in work/ only, and their metrics into a file there that the launcher relays: the
    # config they read names no tracking store (its URI may carry credentials)
    cfg = RunConfig(
        spec=spec,
        data=data,
        out_dir=work_dir(str(out_dir)),
        mlflow_run_id=start_tracking(spec, dataset, run_key, tags),
        tensorboard_dir=str(paths.tensorboard_root() / spec.name / safe_key(run_key)),
        metrics_file=str(metrics_path(out_dir)),
        trial_objective=trial_objective,
        histogram_dir=str(Path(work_dir(str(out_dir))) / "tensorboard"),
        replay_dependencies=_version_trainer_dependencies(spec) if spec.replay_of and in_pods(spec) else None,
    )
    Path(cfg.out_dir).mkdir(exist_ok=True)
    cfg_path = cfg.dump(out_dir / RUN_CONFIG_FILE)
    from trainyard.tracking import mlflow_tracking as mt

    mt.client().update_run(cfg.mlflow_run_id, status="RUNNING")  # a retry's run is running again
    return {
        "config_path": str(cfg_path),
        "run_dir": str(out_dir),
        "mlflow_run_id": cfg.mlflow_run_id,
        "tensorboard_dir": cfg.tensorboard_dir,
    }


def _version_trainer_dependencies(spec: JobSpec) -> list[str]:
    """The dependency set the trainer of the version ``spec.replay_of`` had (:mod:`trainyard.replay`)."""
    from trainyard import replay
    from trainyard.tracking import mlflow_tracking as mt

    assert spec.replay_of is not None
    model, version = spec.replay_of.rsplit(":", 1)
    return replay.trainer_dependencies(replay.recorded(mt.client(), model, version))


def launch_local(
    spec: JobSpec,
    data: dict,
    plan: dict,
    on_line: Callable[[str], None] | None = None,
    devices: list[str] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """The strategy's launcher (torchrun, horovodrun, deepspeed; or the custom command under torchrun) as a
    subprocess; every output line goes to ``on_line`` (the task log). ``devices``: the GPUs the job was
    given (its CUDA_VISIBLE_DEVICES), None to leave the environment's; ``stop``: set to stop the workers
    (the job lost its admission). The launcher records this try's GPU time in the run's usage file, failed
    tries included."""
    from trainyard.training.launchers import local

    local.launch(
        spec,
        data,
        run_dir=plan["run_dir"],
        config_path=plan["config_path"],
        on_line=on_line or (lambda line: log.info("%s", line)),
        devices=devices,
        stop=stop,
    )


def collect_training(
    spec: JobSpec, plan: dict, result: bool = True, waited_s: float | None = None, stopped: bool = False
) -> dict:
    """What the workers left: train_result.json (built-in recipes) or the custom metrics file, their
    metrics not relayed to MLflow yet; plus the GPU time of every try (the launchers' usage records: a retry
    adds to it, queue time is not in it) and its cost. ``result=False``: the curves, time and cost only
    (a sweep trial its pruner stopped left no model). ``waited_s``: the job's wait in the queue, logged
    as ``queue_wait_seconds``. ``stopped``: the workers were killed, so a last line without its newline
    was cut off, not finished."""
    from trainyard.scheduling.resources import resources_in_force, run_cost
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.training import custom, metrics, usage

    out_dir = Path(plan["run_dir"])
    c = mt.client()
    relay_final = not stopped
    metrics.relay(out_dir, c, plan["mlflow_run_id"], plan["tensorboard_dir"], on_line=log.info, final=relay_final)
    metrics.copy_histograms(out_dir, plan["tensorboard_dir"])
    if spec.recipe != "custom":  # a custom program's files say nothing the platform may record as its own
        _record_trainer_environment(c, plan["mlflow_run_id"], out_dir)
    found = {} if not result else custom.collect(out_dir) if spec.recipe == "custom" else built_in_result(out_dir)
    gpu_seconds = usage.gpu_seconds(out_dir)
    tries = usage.tries(out_dir)
    cost = run_cost(resources_in_force(), spec.resources.gpu_type, gpu_seconds)
    log.info(
        "GPU time %.1f GPU-seconds over %d tr%s on %s: cost %.4f",
        gpu_seconds,
        len(tries),
        "y" if len(tries) == 1 else "ies",
        spec.resources.gpu_type,
        cost,
    )
    c.log_metric(plan["mlflow_run_id"], "gpu_seconds", gpu_seconds)
    c.log_metric(plan["mlflow_run_id"], "run_cost", cost)
    if waited_s is not None:
        c.log_metric(plan["mlflow_run_id"], "queue_wait_seconds", waited_s)
    c.set_terminated(plan["mlflow_run_id"], "FINISHED" if result else "KILLED")  # KILLED: stopped by a pruner
    return {
        **found,
        **{k: plan[k] for k in ("mlflow_run_id", "run_dir", "tensorboard_dir")},
        "wall_seconds": round(usage.wall_seconds(out_dir), 3),
        "gpu_seconds": round(gpu_seconds, 3),
        "tries": len(tries),
        "cost": cost,
    }


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
    dataset: dict,
    data: dict,
    run_key: str,
    on_line: Callable[[str], None] | None = None,
    devices: list[str] | None = None,
    stop: threading.Event | None = None,
    tags: dict[str, str] | None = None,
    waited_s: float | None = None,
    trial_objective: str | None = None,
    pruned: Callable[[], bool] = lambda: False,
) -> dict:
    """Local training in one step: plan (the MLflow run with ``tags``), launch on this machine (on
    ``devices`` if given; stopped once ``stop`` is set), collect (with ``waited_s``, its wait in the
    queue). Resumes from the run's newest checkpoint, so a retry continues instead of starting over.
    A sweep trial's workers report ``trial_objective`` each epoch; where ``pruned()``, asked once the
    workers have ended, says the pruner stopped them, only their curves, time and cost are collected."""
    from trainyard.training.launchers.local import WorkersStopped

    plan = plan_training(spec, dataset, data, run_key, tags, trial_objective)
    with _failed_run_on_error(plan):  # a collect that fails leaves no run RUNNING either
        try:
            launch_local(spec, data, plan, on_line, devices, stop)
            stopped = False
        except WorkersStopped:
            if not pruned():
                raise
            # the pruner's word, then the stop, ended them (they did not end of themselves): pruned all the same
            log.info("sweep: the trial's workers were stopped after the pruner's word")
            stopped = True
        was_pruned = pruned()  # asked once the workers have ended: the answer holds from here on
        return collect_training(spec, plan, result=not was_pruned, waited_s=waited_s, stopped=stopped)


@contextlib.contextmanager
def _failed_run_on_error(plan: dict) -> Iterator[None]:
    """The MLflow run of a training whose workers failed is marked FAILED (a retry marks it RUNNING)."""
    try:
        yield
    except BaseException:
        from trainyard.tracking import mlflow_tracking as mt

        with contextlib.suppress(Exception):  # the training's own error is the one to report
            mt.client().set_terminated(plan["mlflow_run_id"], "FAILED")
        raise


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
    dataset: dict,
    data: dict,
    sweep_run: str,
    slot: int,
    on_line: Callable[[str], None] | None = None,
    devices: list[str] | None = None,
    stop: threading.Event | None = None,
    tags: dict[str, str] | None = None,
    waited_s: float | None = None,
) -> dict:
    """One trial of the sweep in ``spec`` on this machine, in slot ``slot`` of the run ``sweep_run``:
    planned, launched and collected as a job of its own (:func:`trainyard.sweeps.trials.run_trial`), its
    MLflow run tagged with ``tags`` and the trial's."""
    from trainyard.sweeps.study import lineage
    from trainyard.sweeps.trials import Watcher, run_trial

    assert spec.sweep is not None
    objective = spec.sweep.objective

    def launch(trial_spec: JobSpec, key: str, trial_tags: dict[str, str], watcher: Watcher) -> dict:
        return train(
            trial_spec,
            dataset,
            data,
            key,
            on_line,
            devices,
            watcher.halt,
            tags={**(tags or {}), **trial_tags},
            waited_s=waited_s,
            trial_objective=objective,
            pruned=watcher.settle,
        )

    return run_trial(spec, sweep_run, slot, launch, lost=stop, of_lineage=lineage(spec, dataset))


def close_sweep(spec: JobSpec, dataset: dict, sweep_run: str) -> dict:
    """The sweep run's end: trials left running failed, the best trial on ``dataset`` chosen, the summary
    logged. The data validation that gated this run (in the sweep run's directory, not the trials') goes
    onto the best trial's MLflow run, which the model version and its card are made from."""
    from trainyard.sweeps.study import close
    from trainyard.tracking import mlflow_tracking as mt

    best = close(spec, dataset, sweep_run)
    log_validation(mt.client(), best["trained"]["mlflow_run_id"], run_dir(spec, sweep_run))
    return best


# -- 4. evaluation and gate --------------------------------------------------------------------------------
def evaluate(spec: JobSpec, trained: dict, data: dict) -> dict:
    """The recipe's metrics on the val (and test) split, logged to the MLflow run; metric signatures
    (BLEU tokenizer, COCO evaluator) become run tags ``eval.*``."""
    from trainyard import recipes
    from trainyard.tracking import mlflow_tracking as mt

    if spec.recipe == "custom":  # the program measured itself; the gate reads its last reports
        log.info("evaluation (reported by the custom command): %s", trained["final_metrics"])
        return trained["final_metrics"]
    recipe = recipes.get(spec.recipe)
    options = recipe.opts(spec)
    metrics, info = recipe.evaluate(trained["model_path"], data, "val", options)
    if "test" in data:
        metrics.update(recipe.evaluate(trained["model_path"], data, "test", options)[0])
    c = mt.client()
    for k, v in metrics.items():
        c.log_metric(trained["mlflow_run_id"], f"eval_{k}", v)
    for k, tag in info.items():
        c.set_tag(trained["mlflow_run_id"], f"eval.{k}", tag)
    log.info("evaluation: %s %s", metrics, info)
    return metrics


def gate(spec: JobSpec, metrics: dict, data: dict | None = None, trained: dict | None = None) -> dict:
    """Thresholds and champion/challenger rules; the full result (every metric, bound, margin) is returned
    for XCom and, with ``trained``, stored on its MLflow run (tags ``gate.*`` + gate_result.json) with the
    run's report (:mod:`trainyard.tracking.report`: curves PNG and one HTML page, pass or fail). The
    caller fails the run (``GateFailed``) if ``passed`` is false. ``validate_spec`` refuses champion
    rules for a custom recipe, so here every rule is measured."""
    from trainyard.evaluation.champion import combined_gate, production_metrics
    from trainyard.evaluation.gate_record import record_gate

    champion = production_metrics(spec, data) if spec.champion and data is not None else None
    result = combined_gate(metrics, spec.gates, champion, spec.champion)
    if champion is not None:
        result["champion_version"] = int(champion["_version"])
    if trained and trained.get("mlflow_run_id"):
        from trainyard.tracking import mlflow_tracking as mt
        from trainyard.tracking import report

        record_gate(trained["mlflow_run_id"], trained["run_dir"], result)
        try:
            report.write(mt.client(), trained["mlflow_run_id"], trained["run_dir"], result)  # passed or not
        except Exception:  # noqa: BLE001 - the report is a view of the run; the gate's verdict stands
            log.warning("could not write the run's report", exc_info=True)
    return result


# -- 5. export and registry --------------------------------------------------------------------------------
def export_onnx(spec: JobSpec, trained: dict, data: dict) -> dict:
    """ONNX export of the trained model, held to parity with PyTorch and to its metric re-computed with
    onnxruntime (see the recipe); with ``export.torchscript``, a TorchScript file too."""
    from trainyard import recipes

    if spec.recipe == "custom":
        return check_custom_onnx(trained)
    recipe = recipes.get(spec.recipe)
    out = recipe.export(trained["model_path"], data, Path(trained["run_dir"]), spec.export, recipe.opts(spec))
    p = out["parity"]
    m = out["metric"]
    log.info(
        "ONNX parity on %d outputs: max |diff| %.3g, mismatched %d; %s torch %.4f onnx %.4f%s",
        p["total"],
        p["max_abs_diff"],
        p["mismatched"],
        m,
        out[f"{m}_torch"],
        out[f"{m}_onnx"],
        f"; TorchScript {out['torchscript_path']}" if out.get("torchscript_path") else "",
    )
    return out


def check_custom_onnx(trained: dict) -> dict:
    """A custom command's model.onnx: valid ONNX that onnxruntime runs to finite outputs. (Parity with a
    framework model is the program's own business: the platform has no reference model for it.)"""
    import numpy as np
    import onnx

    from trainyard.export.onnx_export import onnx_session
    from trainyard.recipes.base import save_input_example
    from trainyard.training import custom
    from trainyard.training.run_config import work_dir

    if not trained.get("onnx_path"):
        raise ExportFailed(f"the custom command wrote no model.onnx into {work_dir(trained['run_dir'])}")
    custom.check_external_data(Path(trained["onnx_path"]))
    onnx.checker.check_model(trained["onnx_path"], full_check=True)
    session = onnx_session(trained["onnx_path"])
    inp = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    example = np.zeros(shape, dtype=np.float32)
    out = session.run(None, {inp.name: example})[0]
    if not np.isfinite(out).all():
        raise ExportFailed(f"{trained['onnx_path']} gives non-finite outputs on a zero input")
    return {
        "onnx_path": trained["onnx_path"],
        "parity": None,
        "input_example": save_input_example(Path(trained["run_dir"]), {inp.name: example}),
    }


def register(
    spec: JobSpec,
    dataset: dict,
    trained: dict,
    exported: dict,
    metrics: dict,
    run_key: str,
    extra_tags: dict[str, str] | None = None,
    user: str = "train_pipeline",
) -> dict:
    """One signed MLflow model version per DAG run: ONNX model (signature, input example), PyTorch weights
    (and TorchScript) beside it, lineage, metrics, metric signatures and the gate result as tags. ``user``:
    who triggered the run, the actor of the staging move in the audit trail."""
    from trainyard.recipes.base import load_input_example
    from trainyard.registry.mlflow_registry import register_onnx
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    check_ownership(spec, c, claim=True)  # before anything is logged: a refused registration leaves nothing behind
    run_tags = c.get_run(trained["mlflow_run_id"]).data.tags
    tags = {
        "dataset.store": dataset["store"],
        "dataset.repo": dataset["repo"],
        "dataset.commit": dataset["commit"],
        "dataset.digest": dataset["digest"],
        "code_version": mt.code_version(),
        "recipe": spec.recipe,
        "team": spec.resources.team,  # whom a move of its aliases is told to
        "params": json.dumps(spec.hyperparameters.model_dump(mode="json"), sort_keys=True),
        "onnx_path": exported["onnx_path"],
        "run_dir": trained["run_dir"],
        **{f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()},
        # what the gate decided and how the metrics were computed, copied from the run
        **{k: v for k, v in run_tags.items() if k.startswith(("gate.", "eval.", "sweep.", "dependencies."))},
        **(extra_tags or {}),
    }
    artifacts = {"pytorch": trained["model_path"]} if trained.get("model_path") else {}
    if exported.get("torchscript_path"):
        artifacts["torchscript"] = exported["torchscript_path"]
    artifacts.update(exported.get("artifacts", {}))  # a recipe's files for the ONNX graph (a tokenizer)
    info = register_onnx(
        c,
        model_name=spec.name,
        run_id=trained["mlflow_run_id"],
        run_key=run_key,
        onnx_path=exported["onnx_path"],
        extra_artifacts=artifacts,
        input_example=load_input_example(exported["input_example"]),
        tags=tags,
        alias=None,  # set below, after signing, through the recorded (verified) alias move
    )
    from trainyard.registry.signing import load_private_key, trusted_keys
    from trainyard.registry.versions import promote, sign_version

    # A digest of every file of the version and an Ed25519 signature over them: promote and rollback
    # refuse a version whose files no longer match. Re-signing the same content keeps the signature.
    signed = sign_version(c, info["name"], info["version"], load_private_key())
    info = {**info, "manifest_sha256": signed["manifest_sha256"], "signing_key_id": signed["key_id"]}
    from trainyard.audit import AuditLog

    trail = AuditLog()
    version = str(info["version"])
    if not any(e.get("model") == info["name"] and e.get("version") == version for e in trail.entries("registration")):
        trail.append(  # once per version: a retried register finds its entry
            "registration",
            user,
            model=info["name"],
            version=version,
            run_key=run_key,
            manifest_sha256=signed["manifest_sha256"],
            key_id=signed["key_id"],
        )
    promote(
        c,
        info["name"],
        info["version"],
        "staging",
        user=user,
        reason=f"registered by {run_key}",
        trusted=trusted_keys(),
    )
    log.info(
        "registered %s version %s (%s), signed by key %s",
        info["name"],
        info["version"],
        "new" if info["created"] else "existing",
        info["signing_key_id"],
    )
    return info
