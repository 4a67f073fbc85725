"""
### train_pipeline

One training job through the whole production line:

`validate_spec` → `resolve_dataset` → `validate_data` → `prepare_data` → `choose_launcher`, then one of
three branches (the others are skipped):

- one training here: `admit` → `train`, and for a job of several nodes (`resources.nodes`) `plan_nodes` →
  a `train_node` per node but the first (mapped): `train` is node 0, which serves the rendezvous, and each
  node runs on a worker of the job's GPU type (on the cluster profile, a host of its own);
- on Kubernetes: `plan_kubernetes` → `train_kubernetes` → `collect_kubernetes`;
- a sweep: `plan_sweep` → a `trial` per slot (`trial.admit` → `trial.train_trial`, mapped) → `close_sweep`;

then `training_result` → `evaluate` → `gate` → `export_onnx` → `register`.

The **JobSpec** is this DAG's Params (the trigger form) or the REST `conf`. It is validated once, by the
first task; an invalid spec fails that task and nothing else runs. The training task (`train` or
`train_kubernetes`) runs in the GPU pool of `resources.gpu_type` and holds `nodes x gpus_per_node` slots,
all of the job's GPUs at once (a local job of several nodes: each node's task its node's; set per run by the
cluster policy in `plugins/airflow_local_settings.py`).
Before a local training, `admit` waits until the admission ledger gives the job its GPUs within its team's
quota and what it may borrow (`trainyard/scheduling/admission/`).

`recipe` picks what is trained: `digits_cnn` (small-image classification), `centernet_detector` (COCO
detection, mAP), `transformer_translator` (parallel text, BLEU/chrF), `resnet_classifier` (a folder of
images per class, accuracy/top-5/macro-F1) or `custom` (your command). Example specs:
`include/config/jobs/*.yaml`; gates must name the recipe's metrics.

Results: the signed model version in MLflow (alias `staging`; ONNX, PyTorch weights, gate result and
metric signatures as tags), metrics and curves in MLflow and TensorBoard, the files in the run's directory.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Param, dag, get_current_context, task, task_group

from trainyard.errors import PermanentError
from trainyard.form import form_fields, run_input
from trainyard.scheduling.admission.ledger import RUNS_IN_FLIGHT
from trainyard.scheduling.resources import pool_name
from trainyard.spec import JobSpec
from trainyard.teams import training_dag
from trainyard_airflow.auth import triggering_user
from trainyard_airflow.errors import fail_permanently
from trainyard_airflow.links import LINKS, ModelVersionLink
from trainyard_airflow.notifications import TeamNotifier, training_time_watch
from trainyard_airflow.operators.admission import RUN_KEY, AdmitOperator, reschedule_at
from trainyard_airflow.operators.launch import KubernetesTrainingLauncher
from trainyard_airflow.policy import training_priority
from trainyard_airflow.team_dags import bundle_team, makes_dags

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.pipeline.records import PinnedDataset, PreparedData, TrainingResult
    from trainyard.pipeline.train import LocalLaunch

# In Airflow's multi-team mode this file is read in every team's bundle and makes that team's own
# train_pipeline.<team> there, for its jobs only; in the shared bundle it makes nothing (team_dags).
TEAM = bundle_team(__file__)
DEFAULT_SPEC = JobSpec.model_validate({"resources": {"team": TEAM}}) if TEAM else JobSpec()
DEFAULT = DEFAULT_SPEC.model_dump(mode="json")
# Parse-time defaults; the cluster policy (plugins/trainyard_airflow/policy.py) sets them per run.
GPU_POOL = pool_name(DEFAULT_SPEC.resources.slot_type)
GPU_SLOTS = DEFAULT_SPEC.resources.total_gpus
TRAINING_WEIGHT = training_priority(DEFAULT_SPEC.resources.priority)

# The team hears of a task that failed for good (the gate's failure with its table), of a new staging version,
# and of a training's end that took its spend past 80 % of its monthly budget (resources.yaml teams.*.notify).
FAILED = TeamNotifier(event="failure")
TRAINING_ENDED = TeamNotifier(event="training_ended")
AT_TRAINING_END: dict[str, Any] = {
    "on_success_callback": [TRAINING_ENDED],
    "on_retry_callback": [TRAINING_ENDED],
    "on_failure_callback": [FAILED, TRAINING_ENDED],
}
# A training task (a job's, a sweep trial's): all of the job's GPUs from its pool, at its priority (set per run
# by the cluster policy), one XCom (its record), and the team told at its end.
ON_GPUS: dict[str, Any] = {
    "multiple_outputs": False,
    "pool": GPU_POOL,
    "pool_slots": GPU_SLOTS,
    "priority_weight": TRAINING_WEIGHT,
    "weight_rule": "absolute",
    **AT_TRAINING_END,
}
# The other nodes of a multi-node training: their node's GPUs (the cluster policy), and no word of the
# training's end to the team (node 0's task says it once).
ON_OTHER_NODES: dict[str, Any] = {k: v for k, v in ON_GPUS.items() if k not in AT_TRAINING_END}
default_args = {
    "owner": "trainyard",
    "retries": 1,
    "retry_delay": timedelta(seconds=10),
    "on_failure_callback": [FAILED],
}


class _Shared(dict):
    """JSON shared rather than copied: Airflow deep-copies the DAG's Params (default and schema) into every
    task it parses, some 50 copies of the JobSpec's schema and defaults, which doubled this file's parse
    time. Nothing changes a Param's default or schema at parse; a run gets its own from the serialized DAG."""

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


def _params() -> dict[str, Param]:
    """The trigger form: a typed input per JobSpec field, in its section (:func:`trainyard.form.form_fields`),
    the GPU types and teams to choose from as the queue has them (resources.yaml, or its last good version
    while an edit broke it; free text where there is none: admission then names what is wrong)."""
    from trainyard.scheduling.resources import ResourcesError, resources_in_force

    try:
        config = resources_in_force(on_broken=lambda _: None)  # the queue's log says what is wrong
    except (ResourcesError, OSError):
        config = None
    return {
        name: Param(
            _Shared(f.default) if isinstance(f.default, dict) else f.default, f.description, schema=_Shared(f.schema)
        )
        for name, f in form_fields(DEFAULT, config, TEAM).items()
    }


def _spec(xcom: dict) -> JobSpec:
    """A task's spec XCom (JSON, validated by the first task) back as the JobSpec, once per task; still a
    job of this DAG's team, and the job the run's conf names (a user may write XComs: another team's team
    would take its quota, budget, policy and models; another job's name, whose runs, files and MLflow
    runs are its team's, would hand this run that job's files, which the later checks hold to the name)."""
    from trainyard.teams import NotAllowed, check_pipeline_team

    spec = JobSpec.model_validate(xcom)
    check_pipeline_team(spec.resources.team, TEAM)
    named = _raw_spec().get("name")
    if spec.name != named:
        raise NotAllowed(
            f"the spec this task was handed names job {spec.name!r}, but the run is of job {named!r}: "
            "validate_spec's result was changed; trigger the job again"
        )
    return spec


def _dataset(spec: JobSpec, xcom: dict) -> PinnedDataset:
    """A task's dataset XCom, held to the job's spec (:func:`trainyard.pipeline.pinned_dataset`): a user may
    write XComs, and one naming another team's repository would hand its data to this job."""
    from trainyard.pipeline.data import pinned_dataset
    from trainyard_airflow.hooks.lakefs_hook import register_store

    register_store()
    return pinned_dataset(spec, xcom)


def _prepared(spec: JobSpec, dataset: PinnedDataset) -> PreparedData:
    """The prepared data's manifest as ``prepare_data`` left it in the cache (a cache hit; built again where
    it is missing), not as an XCom says: one could point the training at another run's files."""
    from trainyard.pipeline.data import prepare_data

    return prepare_data(spec, dataset)


def _run_key() -> str:
    """The ledger's and the run directory's name for this run; ``RUN_KEY`` is the same as a template."""
    dag_run = get_current_context()["dag_run"]
    return f"{dag_run.dag_id}/{dag_run.run_id}"


def _run_tags() -> dict[str, str]:
    """Tags of the run's MLflow runs: who triggered it (``trainyard runs list --user``)."""
    user = triggering_user()
    return {"triggered_by": user} if user else {}


def _raw_spec() -> dict:
    """The run's JobSpec input (:func:`trainyard.form.run_input`): the trigger form sends every field by its
    path, a REST call the sections it overrides as objects."""
    return run_input(get_current_context()["dag_run"].conf, TEAM)


def _linked(task_output: Any) -> Any:
    """A task (by its output) with the MLflow run and TensorBoard links on its page in the UI."""
    task_output.operator.operator_extra_links = LINKS
    return task_output


def _trained_job(spec: dict, trained: dict) -> tuple[JobSpec, TrainingResult, PreparedData]:
    """What this run trained, for the steps after training: the training's result (``training_result``'s
    XCom) held to this run (:func:`trainyard.pipeline.trained_job`; a sweep's best trial is read from its
    study), and the JobSpec it trained with and the data it trained on, from its run config
    (:func:`trainyard.pipeline.records.trained_with`): a user may write XComs."""
    from trainyard.pipeline.records import trained_with
    from trainyard.pipeline.sweep import trained_job

    _, held = trained_job(_spec(spec), _run_key(), trained)
    job_spec, data = trained_with(held)
    return job_spec, held, data


def _evaluated_here(job_spec: JobSpec) -> Path:
    """This run's own directory, where ``evaluate`` records what it measured (a sweep's chosen trial may be
    an earlier run's)."""
    from trainyard.pipeline.records import run_dir

    folder = run_dir(job_spec, _run_key())
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _leased(lease: Any, place: Any = None) -> LocalLaunch:
    """How a training runs on this worker (a LocalLaunch): as its admission's lease says (its devices, the
    signal to stop, its wait in the queue), with its run's MLflow tags; its links shown once it starts;
    ``place``: this node's among a multi-node job's (a NodePlace)."""
    from trainyard.pipeline.train import LocalLaunch
    from trainyard.training.launchers.local import Preemption
    from trainyard_airflow.links import push_while_training

    ti = get_current_context()["ti"]
    return LocalLaunch(
        devices=lease.devices,
        stop=lease.lost,
        preemption=Preemption(lease.preempted, lease.grace_s),
        waited_s=lease.waited_s,
        tags=_run_tags(),
        on_plan=lambda plan: push_while_training(ti, plan),
        node=place,
    )


def _while_admitted(job: Any, spec: JobSpec, work: Any, earlier_s: float = 0.0, node: int = 0) -> dict:
    """``work(lease, place)`` while ``job`` holds its admission (renewed by a heartbeat; released once its
    training can no longer run); a retry long after its admission waits for it again, holding nothing, and
    so does a training that was preempted (its GPUs went back; it resumes from its checkpoint once admitted
    again). It waits rescheduled, not deferred: its GPU pool counts deferred tasks (a Kubernetes training
    holds its GPUs while deferred), and a deferred training would keep the slots its preemptor needs.
    Past ``spec``'s expected hours (``earlier_s`` of earlier tries included) its team is told, once.

    A multi-node job's ``node`` (``place``, a NodePlace; None for a job of one node): node 0 holds the
    admission and serves the rendezvous, each other node follows its admission and joins it
    (:func:`trainyard.scheduling.admission.lease.follow`)."""
    import logging
    from contextlib import nullcontext

    from airflow.sdk.exceptions import AirflowRescheduleException

    from trainyard import paths
    from trainyard.errors import Preempted
    from trainyard.scheduling.admission.lease import follow, hold
    from trainyard.scheduling.admission.ledger import NotAdmitted, default_ledger
    from trainyard.scheduling.budgets import current_spend
    from trainyard.scheduling.hosts import devices_here
    from trainyard.scheduling.nodes import node_place

    ledger = default_ledger()
    spend = current_spend(ledger.config, paths.runs_root())
    context = get_current_context()
    ti = context["ti"]
    # a GPU job gets devices of its own type on this host (CUDA_VISIBLE_DEVICES), held with its admission
    try:
        available = devices_here(job.gpu_type)
    except PermanentError:  # no such type here, or no inventory: its slots go back at once, not at its lease's end
        if node == 0:  # (node 0 holds a multi-node job's admission)
            ledger.release(job.id)
        raise
    final_try = ti.try_number > ti.max_tries
    try:
        with (
            hold(ledger, job, final_try=final_try, available=available, spend=spend)
            if node == 0
            else follow(ledger, job, node, available=available) as lease,
            training_time_watch(spec, job.id, _run_key(), earlier_s, context) if node == 0 else nullcontext(),
        ):
            return work(lease, node_place(ledger, job, node, lease))
    except (NotAdmitted, Preempted) as err:
        again = reschedule_at(ledger.config)
        logging.getLogger(__name__).info("%s; looking again at %s", err, again.isoformat(timespec="seconds"))
        raise AirflowRescheduleException(again) from None


# -- the tasks, in the order they run; train_pipeline() below wires them ------------------------------
# Each returns one record, its XCom return_value. multiple_outputs=False: Airflow also unrolls a task annotated
# `-> dict` into an XCom per key (multiple_outputs inferred), one Execution API call and row each that nobody
# reads (docs/performance.md counts them). A task whose result is read by key says multiple_outputs=True.
@task(multiple_outputs=False)
@fail_permanently
def validate_spec() -> dict:
    """Validate the JobSpec; fails at once, naming every bad field."""
    from trainyard.pipeline.spec import check_ownership, check_worker
    from trainyard.pipeline.spec import validate_spec as check

    spec = check(_raw_spec(), user=triggering_user(), pipeline_team=TEAM)
    check_worker(spec)
    check_ownership(spec)
    return spec.model_dump(mode="json")


@task(multiple_outputs=False)
@fail_permanently
def resolve_dataset(spec: dict) -> dict:
    """Ingest the built-in source if named, and pin the dataset ref to an immutable commit."""
    from trainyard.pipeline.data import resolve_dataset as resolve
    from trainyard_airflow.hooks.lakefs_hook import register_store

    register_store()
    return resolve(_spec(spec)).model_dump()  # the record as JSON only here, at the XCom


@task(multiple_outputs=False)
@fail_permanently
def validate_data(spec: dict, dataset: dict) -> dict:
    """great-expectations suite over the pinned commit: bad data stops the run here."""
    from trainyard.pipeline.data import validate_data as check
    from trainyard_airflow.hooks.lakefs_hook import register_store

    register_store()
    job_spec = _spec(spec)
    return check(job_spec, _dataset(job_spec, dataset), _run_key())


@task(multiple_outputs=False)
@fail_permanently
def prepare_data(spec: dict, dataset: dict, _validated: dict) -> dict:
    """Hash-based train/val(/test) split of the pinned commit, written as the recipe's records in LMDB or
    TFRecord (dataset.format), cached by (commit, split settings, recipe variant)."""
    from trainyard.pipeline.data import prepare_data as prepare
    from trainyard_airflow.hooks.lakefs_hook import register_store

    register_store()
    job_spec = _spec(spec)
    return prepare(job_spec, _dataset(job_spec, dataset)).model_dump(mode="json")  # the record as JSON only here


@task.branch
@fail_permanently
def choose_launcher(spec: dict) -> str:
    """A sweep's trials, or one training here (backends.launcher local) or on Kubernetes."""
    job_spec = _spec(spec)
    if job_spec.sweep is not None:
        return "plan_sweep"
    return "admit" if job_spec.backends.launcher == "local" else "plan_kubernetes"


@task(**ON_GPUS)
@fail_permanently
def train(spec: dict, dataset: dict, data: dict) -> dict:
    """Workers of the spec's strategy on this machine (torchrun for ddp and deepspeed, horovodrun); output
    streamed here; a retry resumes from the newest checkpoint. Holds the job's admission while it runs
    (a heartbeat renews it; released at the end)."""
    from trainyard.pipeline.records import run_dir
    from trainyard.pipeline.train import train as run
    from trainyard.scheduling.admission.ledger import job_for
    from trainyard.training.usage import wall_seconds

    job_spec = _spec(spec)
    pinned = _dataset(job_spec, dataset)
    prepared = _prepared(job_spec, pinned)  # from the cache, not from the XCom ``data``
    job = job_for(job_spec.resources, _run_key(), triggering_user())
    return _while_admitted(
        job,
        job_spec,
        lambda lease, place: run(job_spec, pinned, prepared, _run_key(), _leased(lease, place)).model_dump(mode="json"),
        earlier_s=wall_seconds(run_dir(job_spec, _run_key())),
    )


@task(multiple_outputs=False)
@fail_permanently
def plan_nodes(spec: dict) -> list[int]:
    """The nodes of a multi-node job but node 0 (which `train` runs): one `train_node` each; none for a job
    of one node."""
    return list(range(1, _spec(spec).resources.nodes))


@task(**ON_OTHER_NODES)
@fail_permanently
def train_node(spec: dict, dataset: dict, data: dict, node: int) -> dict:
    """Node ``node`` of a multi-node training: its workers on this machine, peers of node 0's (`train`),
    which holds the job's admission, serves the rendezvous and writes the result. One whose job ended
    before it joined (node 0 finished without it: an elastic job) has nothing left to do."""
    from trainyard.pipeline.train import train_node as run
    from trainyard.scheduling.admission.ledger import default_ledger, job_for

    job_spec = _spec(spec)
    prepared = _prepared(job_spec, _dataset(job_spec, dataset))
    job = job_for(job_spec.resources, _run_key(), triggering_user())
    if default_ledger().finished(job.id):
        return {"node": node, "ended": "the job finished before this node joined it"}
    ti = get_current_context()["ti"]
    if ti.get_ti_count(dag_id=ti.dag_id, task_ids=["train"], run_ids=[ti.run_id], states=["failed", "upstream_failed"]):
        raise PermanentError(f"node 0's task (train) failed for good: node {node} has no training to join")

    def work(lease: Any, place: Any) -> dict:
        run(job_spec, prepared, _run_key(), _leased(lease, place))
        return {"node": node}

    return _while_admitted(job, job_spec, work, node=node)


@task
@fail_permanently
def plan_sweep(spec: dict) -> list[str]:
    """Open the sweep's Optuna study, or resume it (a sweep of the same name ran before), seeded from
    ``warm_start_from`` when new: one slot per trial this run adds."""
    from trainyard.pipeline.sweep import plan_sweep as plan

    return [f"{_run_key()}/slot-{i}" for i in plan(_spec(spec))]


@task(**ON_GPUS)
@fail_permanently
def train_trial(spec: dict, dataset: dict, data: dict, slot: str) -> dict:
    """One trial: values from the study, trained like a job of its own (run directory, MLflow run),
    stopped at an epoch's end when the pruner says so; told to the study as complete, pruned or failed.
    A retry fails the trial its earlier try left running and trains a new one."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.pipeline.sweep import train_trial as run
    from trainyard.scheduling.admission.ledger import job_for
    from trainyard.sweeps.study import GridSpent

    job_spec = _spec(spec)
    assert job_spec.sweep is not None
    pinned = _dataset(job_spec, dataset)
    prepared = _prepared(job_spec, pinned)  # from the cache, not from the XCom ``data``
    job = job_for(job_spec.resources, slot, triggering_user(), _run_key(), job_spec.sweep.parallelism)
    number = int(slot.rsplit("-", 1)[1])
    try:
        return _while_admitted(
            job,
            job_spec,
            lambda lease, _place: run(job_spec, pinned, prepared, _run_key(), number, _leased(lease)),
        )
    except GridSpent as err:  # another run of the sweep took the last points: nothing to train here
        raise AirflowSkipException(str(err)) from None


@task(multiple_outputs=False, trigger_rule="all_done")
@fail_permanently
def close_sweep() -> dict:
    """Once every trial task is done, whatever its end (a trial that failed, was skipped or marked by
    hand): trials left running are failed, the best trial of this data and spec is chosen (it goes on
    to evaluate, gate, export and register) and the summary is logged to MLflow. Skipped where no
    sweep was planned (not a sweep, or the run failed before its trials): its inputs are read here, as
    an argument they would fail the task first."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.pipeline.sweep import close_sweep as close

    ti = get_current_context()["ti"]
    if ti.xcom_pull(task_ids="plan_sweep") is None:
        raise AirflowSkipException("no sweep was planned in this run")
    job_spec = _spec(ti.xcom_pull(task_ids="validate_spec"))
    best = close(job_spec, _dataset(job_spec, ti.xcom_pull(task_ids="resolve_dataset")), _run_key())
    return {**best, "trained": best["trained"].model_dump(mode="json")}  # the record as JSON only here


@task(multiple_outputs=True)  # its config_path is read by key (train_kubernetes's argument), its whole by collect
@fail_permanently
def plan_kubernetes(spec: dict, dataset: dict, data: dict) -> dict:
    """MLflow run and run config on the shared volume, for the pods to start from."""
    from trainyard.pipeline.train import plan_training

    job_spec = _spec(spec)
    pinned = _dataset(job_spec, dataset)
    plan = plan_training(job_spec, pinned, _prepared(job_spec, pinned), _run_key(), tags=_run_tags())
    return plan.model_dump()


@task(multiple_outputs=False, **AT_TRAINING_END)
@fail_permanently
def collect_kubernetes(spec: dict, plan: dict) -> dict:
    """Read what the pods left on the shared volume (result, GPU time of every try, cost)."""
    from trainyard.pipeline.records import held_plan
    from trainyard.pipeline.train import collect_training

    job_spec = _spec(spec)
    held = held_plan(job_spec, _run_key(), plan)  # the plan is an XCom: held to the run
    return collect_training(job_spec, held).model_dump(mode="json")


@task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
@fail_permanently
def training_result() -> dict:
    """The result of whichever branch ran (the others were skipped), a TrainingResult as JSON: a sweep's is
    its best trial's."""
    from trainyard.pipeline.records import TrainingResult, from_xcom

    ti = get_current_context()["ti"]
    swept = ti.xcom_pull(task_ids="close_sweep")
    if swept:
        return from_xcom(TrainingResult, swept["trained"], "close_sweep").model_dump(mode="json")
    if JobSpec.model_validate(ti.xcom_pull(task_ids="validate_spec")).sweep is not None:
        raise PermanentError("the sweep's close_sweep task left no result: nothing to evaluate or register")
    local = ti.xcom_pull(task_ids="train")
    step, trained = ("train", local) if local else ("collect_kubernetes", ti.xcom_pull(task_ids="collect_kubernetes"))
    return from_xcom(TrainingResult, trained, step).model_dump(mode="json")


@task(multiple_outputs=False)
@fail_permanently
def evaluate(spec: dict, trained: dict, data: dict) -> dict:
    """The recipe's metrics on the val split (and the test split, if the spec keeps one), logged to the
    MLflow run and recorded in the run's directory for the gate and the registration; a custom command's
    are the ones it reported."""
    from trainyard.pipeline.evaluate import evaluate as run
    from trainyard.pipeline.records import record_evaluation

    job_spec, held, prepared = _trained_job(spec, trained)
    metrics = run(job_spec, held, prepared)
    record_evaluation(_evaluated_here(job_spec), held, metrics)
    return metrics


@task(multiple_outputs=False)
@fail_permanently
def gate(spec: dict, metrics: dict, data: dict, trained: dict) -> dict:
    """Thresholds and champion/challenger rules from the spec; the full result goes to XCom and onto
    the MLflow run (then the model version); a breach fails the run here."""
    from trainyard.evaluation.gate import GateFailed
    from trainyard.pipeline.evaluate import gate as check
    from trainyard.pipeline.records import held_evaluation, record_verdict

    job_spec, held, prepared = _trained_job(spec, trained)
    here = _evaluated_here(job_spec)
    result = check(job_spec, held_evaluation(here, held, metrics), prepared, held)
    record_verdict(here, result["passed"])
    get_current_context()["ti"].xcom_push(key="gate_result", value=result)
    if not result["passed"] and not job_spec.replay_of:  # a replay measures; its verdict is recorded
        raise GateFailed(result["message"])
    return result


@task(multiple_outputs=False)
@fail_permanently
def export_onnx(spec: dict, trained: dict, data: dict, _gate: dict) -> dict:
    """ONNX export; onnxruntime must match PyTorch on fixed inputs and on the recipe's val metric.
    Skipped, with register, for a replay (``replay_of``): it only measures."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.pipeline.publish import export_onnx as run

    job_spec, held, prepared = _trained_job(spec, trained)
    if job_spec.replay_of:
        raise AirflowSkipException(f"a replay of {job_spec.replay_of} exports and registers nothing")
    return run(job_spec, held, prepared).model_dump(mode="json")


@task(multiple_outputs=False, on_success_callback=[TeamNotifier(event="registered")])
@fail_permanently
def register(spec: dict, dataset: dict, trained: dict, exported: dict, metrics: dict) -> dict:
    """MLflow model version (signature, input example, lineage tags), alias staging; once per run
    (found again by the run key tag on a retry)."""
    from trainyard.pipeline.publish import register as run
    from trainyard.spec import SPEC_DIGEST_TAG, spec_digest

    user = triggering_user() or "train_pipeline"
    # the run's own spec (not a sweep's trial spec): a retraining job compares its next spec with it
    identity = {SPEC_DIGEST_TAG: spec_digest(_spec(spec))}
    from trainyard.pipeline.records import held_evaluation, held_export
    from trainyard.teams import NotAllowed

    job_spec, held, prepared = _trained_job(spec, trained)
    lineage = _dataset(job_spec, dataset)  # what the version's lineage says it was trained on ...
    if lineage.commit != prepared.commit:  # ... which must be what it trained on
        raise NotAllowed(
            f"resolve_dataset's commit {lineage.commit[:12]} is not the commit {prepared.commit[:12]} this run trained "
            "on: resolve_dataset's result was changed; trigger the job again"
        )
    measured = held_evaluation(_evaluated_here(job_spec), held, metrics, passed_gate=True)
    return run(
        job_spec, lineage, held, held_export(job_spec, held, exported), measured, _run_key(), identity, user=user
    )


@dag(
    dag_id=training_dag(TEAM),
    schedule=None,
    catchup=False,
    max_active_runs=RUNS_IN_FLIGHT,
    default_args=default_args,
    tags=["trainyard", "training", *([f"team:{TEAM}"] if TEAM else [])],
    doc_md=__doc__,
    params=_params(),
)
def train_pipeline():
    # A task call returns an XComArg at parse time; the task it is passed to receives the JSON it stands for
    # at run time. `Any` says both to mypy, which still checks each call's arguments by count and name.
    spec: Any = validate_spec()
    dataset: Any = resolve_dataset(spec)
    checked: Any = validate_data(spec, dataset)
    data: Any = prepare_data(spec, dataset, checked)
    launcher = choose_launcher(spec)
    admitted = AdmitOperator(
        task_id="admit",
        spec=spec,
        pipeline_team=TEAM,
        doc_md=(
            "Waits until the admission ledger gives the job its GPUs: its team's quota and what it may borrow, "
            "in order of priority and arrival, a large job passed by smaller ones for at most "
            "scheduling.max_wait_minutes. Deferred while it waits: no worker held or started "
            "(trainyard/scheduling/admission/)."
        ),
    )
    local = _linked(train(spec, dataset, data))
    plan: Any = plan_kubernetes(spec, dataset, data)
    on_kubernetes = KubernetesTrainingLauncher(
        task_id="train_kubernetes",
        pipeline_team=TEAM,
        spec=spec,
        run_key=RUN_KEY,
        config_path=plan["config_path"],
        pool=GPU_POOL,
        pool_slots=GPU_SLOTS,
        doc_md=(
            "A Pod (one node) or an Indexed Job + headless Service; waits deferred (no worker slot) and "
            "keeps all of the job's GPUs in its pool meanwhile (the GPU pools count deferred tasks). "
            "Deleted on failure, timeout or mark-failed."
        ),
    )
    remote = collect_kubernetes(spec, plan)

    @task_group(group_id="trial")
    def trial(slot: str) -> None:
        """One trial of a sweep: admitted like any job (at most sweep.parallelism of the run's at once), then
        trained."""
        admitted = AdmitOperator(
            task_id="admit",
            spec=spec,
            pipeline_team=TEAM,
            run_key=slot,
            group=RUN_KEY,
            doc_md="Waits until the admission ledger gives the trial its GPUs, as `admit` does for one training.",
        )
        admitted >> _linked(train_trial(spec, dataset, data, slot))

    slots: Any = plan_sweep(spec)
    launcher >> slots
    data >> slots
    best = close_sweep()
    trial.expand(slot=slots) >> best
    # admitted once its data is ready: a run that fails before training never queues, and no admitted
    # slots idle while the data is prepared
    [launcher, data] >> admitted
    launcher >> plan
    admitted >> local
    nodes: Any = plan_nodes(spec)
    admitted >> nodes
    train_node.partial(spec=spec, dataset=dataset, data=data).expand(node=nodes)
    on_kubernetes >> remote
    trained: Any = training_result()
    [local, remote, best] >> trained
    metrics: Any = _linked(evaluate(spec, trained, data))
    verdict: Any = gate(spec, metrics, data, trained)
    exported: Any = export_onnx(spec, trained, data, verdict)
    registered: Any = register(spec, dataset, trained, exported, metrics)
    registered.operator.operator_extra_links = (ModelVersionLink(),)


if makes_dags(TEAM):
    train_pipeline_dag = train_pipeline()  # not `dag`: that is the decorator's name

if __name__ == "__main__":
    train_pipeline_dag.test()
