"""The steps of train_pipeline as plain functions, a module per stage: a validated JobSpec and JSON-able
records in, JSON-able records out.

=========== ======================================================================================
stage       steps
=========== ======================================================================================
spec        ``validate_spec``, ``check_worker``, ``check_ownership``
data        ``resolve_dataset``, ``pinned_dataset``, ``validate_data``, ``prepare_data``
train       ``plan_training``, ``launch_local``, ``collect_training``, ``train``
sweep       ``plan_sweep``, ``train_trial``, ``close_sweep``, ``trained_job``
evaluate    ``evaluate``, ``gate``
publish     ``export_onnx``, ``register``
records     ``PinnedDataset``, ``PreparedData``, ``TrainingPlan``, ``TrainingResult``, ``ExportedModel`` (typed,
            JSON only at the XCom: ``from_xcom``); ``run_dir``; ``held_plan``, ``held_training``,
            ``held_export``, ``held_evaluation``: what an XCom hands on, held to the job and its run (and
            ``data.pinned_dataset``); ``trained_with``: the spec and data a training trained with
=========== ======================================================================================

The DAG only wires these together (turning each spec XCom back into a JobSpec once) and imports each
from its stage's module; tests and the CLI call them directly, also as ``trainyard.pipeline.<step>``.
Every step reads pinned inputs (a dataset commit, a model file) and writes under a key derived from them,
so re-running a step never duplicates anything.
"""

from trainyard.pipeline.data import (
    DataValidationError,
    checkout,
    pinned_dataset,
    prepare_data,
    resolve_dataset,
    validate_data,
)
from trainyard.pipeline.evaluate import evaluate, gate
from trainyard.pipeline.publish import check_custom_onnx, export_onnx, register
from trainyard.pipeline.records import (
    ExportedModel,
    TrainingResult,
    held_export,
    held_training,
    run_dir,
)
from trainyard.pipeline.spec import check_ownership, check_worker, validate_spec
from trainyard.pipeline.sweep import close_sweep, plan_sweep, train_trial, trained_job
from trainyard.pipeline.train import (
    RESULT_FIELDS,
    LocalLaunch,
    built_in_result,
    collect_training,
    in_pods,
    launch_local,
    plan_training,
    start_tracking,
    train,
)

__all__ = [
    "RESULT_FIELDS",
    "DataValidationError",
    "ExportedModel",
    "LocalLaunch",
    "TrainingResult",
    "built_in_result",
    "check_custom_onnx",
    "check_ownership",
    "check_worker",
    "checkout",
    "close_sweep",
    "collect_training",
    "evaluate",
    "export_onnx",
    "gate",
    "held_export",
    "held_training",
    "in_pods",
    "launch_local",
    "pinned_dataset",
    "plan_sweep",
    "plan_training",
    "prepare_data",
    "register",
    "resolve_dataset",
    "run_dir",
    "start_tracking",
    "train",
    "train_trial",
    "trained_job",
    "validate_data",
    "validate_spec",
]
