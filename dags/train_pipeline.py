"""
### train_pipeline

One training job through the whole production line:

`validate_spec` → `resolve_dataset` → `validate_data` → `prepare_data` → `choose_launcher` →
`train` (local) | `plan_kubernetes` → `train_kubernetes` → `collect_kubernetes` → `training_result` →
`evaluate` → `gate` → `export_onnx` → `register`

The **JobSpec** is this DAG's Params (the trigger form) or the REST `conf`. It is validated once, by the
first task; an invalid spec fails that task and nothing else runs. The training task (`train` or
`train_kubernetes`) runs in the GPU pool of `resources.gpu_type` and holds `nodes x gpus_per_node` slots,
all of the job's GPUs at once (set per run by the cluster policy in `plugins/airflow_local_settings.py`).

`recipe` picks what is trained: `digits_cnn` (image classification), `centernet_detector` (COCO
detection, mAP), `transformer_translator` (parallel text, BLEU/chrF) or `custom` (your command). Example
specs: `include/config/jobs/*.yaml`; gates must name the recipe's metrics.

Results: the signed model version in MLflow (alias `staging`; ONNX, PyTorch weights, gate result and
metric signatures as tags), metrics and curves in MLflow and TensorBoard, the files in the run's directory.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from trainyard.scheduling.resources import pool_name
from trainyard.spec import JobSpec
from trainyard_airflow.operators.launch import KubernetesTrainingLauncher

DEFAULT = JobSpec().model_dump(mode="json")
# Parse-time defaults; the cluster policy (plugins/trainyard_airflow/policy.py) sets them per run.
GPU_POOL = pool_name(DEFAULT["resources"]["gpu_type"])
GPU_SLOTS = DEFAULT["resources"]["nodes"] * DEFAULT["resources"]["gpus_per_node"]

PARAM_DOCS = {
    "name": "Job name; also the registered model's name.",
    "recipe": "Built-in recipe (digits_cnn | centernet_detector | transformer_translator) or custom.",
    "dataset": "Dataset store, repository and ref (branch, tag or commit id); the run pins the commit.",
    "split": "Train/val split: val_fraction and seed (assignment by a hash of each sample key).",
    "hyperparameters": "epochs, batch_size, learning_rate, optimizer (sgd | adamw), momentum, weight_decay, seed.",
    "resources": "nodes, gpus_per_node (= processes = pool slots), gpu_type (= pool), team, priority.",
    "gates": "Metric thresholds the model must meet to be exported and registered.",
    "champion": "Champion/challenger rules: [{metric, margin, higher_is_better}] against the 'production' version.",
    "backends": "launcher (local | kubernetes), tracking and registry backends.",
    "distributed": "strategy (ddp | horovod | deepspeed), max_restarts, zero_stage, precision.",
    "checkpointing": "every_steps or every_minutes (default: every epoch), keep_last.",
    "kubernetes": "namespace, image, pull policy, priority class, node selector, tolerations, MIG profile, PVC, env.",
    "custom": "Bring your own training (recipe 'custom'): command and optional image.",
    "export": "ONNX parity tolerances (rtol, atol), allowed metric difference, optional TorchScript file.",
    "recipe_options": "Options of the recipe, e.g. {image_size: 64} (detection) or {d_model: 64, max_len: 32} (translation).",
}
_TYPES = {str: "string", dict: "object", list: "array", type(None): ["null", "object"]}

default_args = {"owner": "trainyard", "retries": 1, "retry_delay": timedelta(seconds=10)}


def _raw_spec() -> tuple[dict, str]:
    """The JobSpec defaults (= the Params) overlaid with the run's conf: the trigger form sends every
    field as conf, a REST call sends what it overrides. Unknown keys stay, so the spec can refuse them."""
    dag_run = get_current_context()["dag_run"]
    raw = {**DEFAULT, **(dag_run.conf or {})}
    return raw, f"{dag_run.dag_id}/{dag_run.run_id}"


@dag(
    dag_id="train_pipeline",
    schedule=None,
    catchup=False,
    max_active_runs=2,
    default_args=default_args,
    tags=["trainyard", "training"],
    doc_md=__doc__,
    params={
        key: Param(value, type=_TYPES[type(value)], description=PARAM_DOCS[key], title=key)
        for key, value in DEFAULT.items()
    },
)
def train_pipeline():
    @task(retries=0)
    def validate_spec() -> dict:
        """Validate the JobSpec; fails at once, naming every bad field."""
        from airflow.sdk.exceptions import AirflowFailException

        from trainyard.pipeline import validate_spec as check
        from trainyard.spec import SpecError

        raw, _ = _raw_spec()
        try:
            return check(raw)
        except SpecError as err:
            raise AirflowFailException(str(err)) from None

    @task
    def resolve_dataset(spec: dict) -> dict:
        """Ingest the built-in source if named, and pin the dataset ref to an immutable commit."""
        from trainyard.pipeline import resolve_dataset as resolve
        from trainyard_airflow.hooks.lakefs_hook import register_store

        register_store()

        return resolve(spec)

    @task(retries=0)
    def validate_data(spec: dict, dataset: dict) -> dict:
        """great-expectations suite over the pinned commit: bad data stops the run here."""
        from airflow.sdk.exceptions import AirflowFailException

        from trainyard.pipeline import DataValidationError, validate_data as check
        from trainyard_airflow.hooks.lakefs_hook import register_store

        register_store()

        try:
            return check(spec, dataset, _raw_spec()[1])
        except DataValidationError as err:
            raise AirflowFailException(str(err)) from None

    @task
    def prepare_data(spec: dict, dataset: dict, _validated: dict) -> dict:
        """Hash-based train/val split written to LMDB, cached by (commit, split settings)."""
        from trainyard.pipeline import prepare_data as prepare
        from trainyard_airflow.hooks.lakefs_hook import register_store

        register_store()

        return prepare(spec, dataset)

    @task.branch
    def choose_launcher(spec: dict) -> str:
        """backends.launcher: train here (local) or on Kubernetes."""
        return "train" if spec["backends"]["launcher"] == "local" else "plan_kubernetes"

    @task(pool=GPU_POOL, pool_slots=GPU_SLOTS)
    def train(spec: dict, dataset: dict, data: dict) -> dict:
        """Workers of the spec's strategy on this machine (torchrun / horovodrun / deepspeed); output
        streamed here; a retry resumes from the newest checkpoint."""
        from trainyard.pipeline import train as run

        return run(spec, dataset, data, _raw_spec()[1])

    @task
    def plan_kubernetes(spec: dict, dataset: dict, data: dict) -> dict:
        """MLflow run and run config on the shared volume, for the pods to start from."""
        from trainyard.pipeline import plan_training

        return plan_training(spec, dataset, data, _raw_spec()[1])

    @task
    def collect_kubernetes(spec: dict, plan: dict) -> dict:
        """Read what the pods left on the shared volume (result, cost)."""
        from trainyard.pipeline import collect_training

        return collect_training(spec, plan)

    @task(trigger_rule="none_failed_min_one_success")
    def training_result() -> dict:
        """The result of whichever launcher ran (the other branch was skipped)."""
        ti = get_current_context()["ti"]
        return ti.xcom_pull(task_ids="train") or ti.xcom_pull(task_ids="collect_kubernetes")

    @task
    def evaluate(spec: dict, trained: dict, data: dict) -> dict:
        """Metrics on the val split, logged to the MLflow run."""
        from trainyard.pipeline import evaluate as run

        return run(spec, trained, data)

    @task(retries=0)
    def gate(spec: dict, metrics: dict, data: dict, trained: dict) -> dict:
        """Thresholds and champion/challenger rules from the spec; the full result goes to XCom and onto
        the MLflow run (then the model version); a breach fails the run here."""
        from airflow.sdk.exceptions import AirflowFailException

        from trainyard.pipeline import gate as check

        result = check(spec, metrics, data, trained)
        get_current_context()["ti"].xcom_push(key="gate_result", value=result)
        if not result["passed"]:
            raise AirflowFailException(result["message"])
        return result

    @task
    def export_onnx(spec: dict, trained: dict, data: dict, _gate: dict) -> dict:
        """ONNX export; onnxruntime must match PyTorch on fixed inputs and on the recipe's val metric."""
        from trainyard.pipeline import export_onnx as run

        return run(spec, trained, data)

    @task
    def register(spec: dict, dataset: dict, trained: dict, exported: dict, metrics: dict) -> dict:
        """MLflow model version (signature, input example, lineage tags), alias staging; once per run."""
        from trainyard.pipeline import register as run

        ctx = get_current_context()
        run_key = _raw_spec()[1]
        return run(spec, dataset, trained, exported, metrics, run_key,
                   extra_tags={"dag_id": ctx["dag_run"].dag_id, "airflow_run_id": ctx["dag_run"].run_id})

    spec = validate_spec()
    dataset = resolve_dataset(spec)
    checked = validate_data(spec, dataset)
    data = prepare_data(spec, dataset, checked)
    launcher = choose_launcher(spec)
    local = train(spec, dataset, data)
    plan = plan_kubernetes(spec, dataset, data)
    on_kubernetes = KubernetesTrainingLauncher(
        task_id="train_kubernetes",
        spec=spec,
        run_key="{{ dag_run.dag_id }}/{{ dag_run.run_id }}",
        config_path=plan["config_path"],
        pool=GPU_POOL,
        pool_slots=GPU_SLOTS,
        doc_md="One Indexed Job (a pod per node) + headless Service; holds all of the job's GPUs in its pool.",
    )
    remote = collect_kubernetes(spec, plan)
    launcher >> [local, plan]
    on_kubernetes >> remote
    trained = training_result()
    [local, remote] >> trained
    metrics = evaluate(spec, trained, data)
    verdict = gate(spec, metrics, data, trained)
    exported = export_onnx(spec, trained, data, verdict)
    register(spec, dataset, trained, exported, metrics)


dag = train_pipeline()

if __name__ == "__main__":
    dag.test()
