"""What the steps hand on, and where a run keeps its files: the run directory of a job's run, and the
check that a step's result (an XCom, which a user may write) names only the job's own files and MLflow run.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from trainyard import paths
from trainyard.spec import JobSpec


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
