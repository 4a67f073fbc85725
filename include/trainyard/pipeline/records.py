"""What the steps hand on, and where a run keeps its files: the run directory of a job's run, and the
check that a step's result (an XCom, which a user may write) names only the job's own files and MLflow run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from trainyard import paths
from trainyard.spec import JobSpec

R = TypeVar("R", bound=BaseModel)  # a record's type


class PinnedDataset(BaseModel):
    """The job's dataset ref pinned to an immutable commit (``resolve_dataset``'s result): what every later
    step reads. JSON only at the XCom boundary, where a later task holds it to the job again
    (:func:`trainyard.pipeline.data.pinned_dataset`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str
    repo: str
    ref: str  # as the spec named it (a branch, a tag, a commit id)
    commit: str  # the commit id it resolved to
    digest: str  # of the commit's file list (trainyard.data.store.tree_digest)
    files: int


class TrainingPlan(BaseModel):
    """What a training starts from (``plan_training``'s result): the run config its workers read, the run's
    directory, its MLflow run and TensorBoard directory. All but the MLflow run follow from the job and the
    run key (:func:`held_plan`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config_path: str
    run_dir: str
    mlflow_run_id: str = Field(min_length=1)
    tensorboard_dir: str


def from_xcom(model: type[R], value: Mapping[str, Any] | R, step: str) -> R:
    """``value`` as the record ``model`` (an XCom a user may write: nothing but the record's own fields, each
    of its type); NotAllowed, naming ``step`` whose result it claims to be and the fields that are wrong (not
    their values), if it is not one."""
    from pydantic import ValidationError

    from trainyard.teams import NotAllowed

    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as err:
        wrong = sorted({".".join(map(str, e["loc"]))[:64] or "the value itself" for e in err.errors()})
        article = "an" if model.__name__[0] in "AEIOU" else "a"
        named = ", ".join(wrong[:5]) + (", ..." if len(wrong) > 5 else "")
        raise NotAllowed(
            f"what this task was handed as {step}'s result is not {article} {model.__name__} ({err.error_count()} "
            f"field(s) wrong: {named}): {step}'s result was changed; trigger the job again"
        ) from None


def run_dir(spec: JobSpec, run_key: str) -> Path:
    """Where the run ``run_key`` of the job keeps its files: ``$TRAINYARD_HOME/runs/<name>/<run>/``."""
    return paths.run_dir(spec.name, run_key)


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


def lineage_tags(dataset: PinnedDataset) -> dict[str, str]:
    """What a run and its model version were made from, as MLflow tags: the pinned dataset and the code."""
    from trainyard.tracking import mlflow_tracking as mt

    return {
        "dataset.store": dataset.store,
        "dataset.repo": dataset.repo,
        "dataset.commit": dataset.commit,
        "dataset.digest": dataset.digest,
        "code_version": mt.code_version(),
    }


def tensorboard_dir(spec: JobSpec, run_key: str) -> Path:
    """Where the run ``run_key`` of the job writes its curves for TensorBoard."""
    from trainyard.spec import safe_key

    return paths.tensorboard_root() / spec.name / safe_key(run_key)


def held_plan(spec: JobSpec, run_key: str, plan: Mapping[str, Any] | TrainingPlan) -> TrainingPlan:
    """A later task's copy of ``plan_training``'s result (an XCom, which a user may write), held to the job's
    run ``run_key``: its paths exactly the run's own, its MLflow run one of the job's experiment. NotAllowed
    naming what is not."""
    from trainyard.teams import NotAllowed
    from trainyard.training.run_config import RUN_CONFIG_FILE

    held = from_xcom(TrainingPlan, plan, "plan_kubernetes")
    rdir = run_dir(spec, run_key)
    expected = {
        "run_dir": rdir,
        "config_path": rdir / RUN_CONFIG_FILE,
        "tensorboard_dir": tensorboard_dir(spec, run_key),
    }
    for field, path in expected.items():
        if Path(getattr(held, field)).resolve() != path.resolve():
            raise NotAllowed(
                f"{field} {getattr(held, field)} is not run {run_key}'s of job {spec.name!r} ({path}): this task's "
                "input was changed; trigger the job again"
            )
    own_run_files(spec, {"mlflow_run_id": held.mlflow_run_id})  # a run of the job's experiment ...
    from trainyard.tracking import mlflow_tracking as mt

    tagged = mt.client().get_run(held.mlflow_run_id).data.tags.get(mt.RUN_KEY_TAG)
    if tagged != run_key:  # ... and this run key's
        raise NotAllowed(
            f"MLflow run {held.mlflow_run_id} is run {tagged}'s, not {run_key}'s: this task's input was changed; "
            "trigger the job again"
        )
    return held
