"""What the steps hand on, and where a run keeps its files: the run directory of a job's run, and the
checks that a step's result (an XCom, which a user may write) is its record, naming only the job's own files
and MLflow run. The prepared data's record is made where the data is prepared, below the recipes that read
it (:class:`trainyard.data.prepare.PreparedData`), and named here with the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from trainyard import paths
from trainyard.data.prepare import PreparedData as PreparedData  # re-exported: the records in one place
from trainyard.spec import JobSpec

if TYPE_CHECKING:
    from mlflow.entities import Run

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


class TrainingResult(BaseModel):
    """What a training left (``collect_training``'s result): its MLflow run and files, its time and cost
    over every try, its model (a built-in recipe's weights, a custom command's ONNX file) and the last value
    of each metric its workers reported; a built-in trainer's loop adds its own record. JSON only at the
    XCom boundary, where a later step holds it to its run (:func:`held_training`), and in a sweep trial's
    Optuna attributes (the platform's own store: :func:`trainyard.sweeps.study.trained_of`). A trial its
    pruner stopped left no model and no metrics. Its ``tensorboard_dir`` is not held: only the UI's links
    and a trial's hparams read it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mlflow_run_id: str = Field(min_length=1)
    run_dir: str
    tensorboard_dir: str
    wall_seconds: float
    gpu_seconds: float  # of every try (a retry adds to it), queue time not in it
    tries: int
    cost: float
    model_path: str | None = None  # a built-in recipe's weights (work/model.pt)
    onnx_path: str | None = None  # a custom command's model (work/model.onnx), where it wrote one
    steps: int | None = None
    # a sweep's best trial (sweeps.study.close): its study and its number (sweeps.study.finished_trial)
    sweep: str | None = None
    sweep_trial: int | None = None
    # the last value of each metric the workers reported: a built-in recipe's val_*, a custom program's own
    final_metrics: dict[str, float] = {}
    # the built-in loop's record (trainyard.training.loop.finish; pipeline.train.RESULT_FIELDS): None for a
    # custom command
    recipe: str | None = None
    epochs: int | None = None
    world_size: int | None = None
    strategy: str | None = None
    train_seconds: float | None = None
    resumed_from_step: int | None = None
    samples_per_second: float | None = None
    loop_seconds: float | None = None
    checkpoint_stall_seconds: float | None = None
    checkpoints: int | None = None

    def files(self) -> list[str]:
        """The files it names: each must be its run's (:func:`held_training`)."""
        return [f for f in (self.run_dir, self.model_path, self.onnx_path) if f]

    def model_file(self) -> str | None:
        """The model it left: a built-in recipe's weights, a custom command's ONNX file (None: a pruned trial's)."""
        return self.model_path or self.onnx_path

    def weights(self) -> str:
        """A built-in recipe's model.pt, which its training always leaves (:func:`trainyard.pipeline.train.
        built_in_result`); PermanentError where this result names none."""
        if not self.model_path:
            from trainyard.errors import PermanentError

            raise PermanentError(f"the training of run {self.run_dir} left no model.pt")
        return self.model_path


def metrics_folded(reported: Mapping[str, Any]) -> dict[str, Any]:
    """A training's result as the workers' records give it, a built-in recipe's val_* metrics beside the
    other fields, with those metrics in ``final_metrics`` (a custom program's own are there already; a name
    in both keeps its ``final_metrics`` value): the fields of a :class:`TrainingResult`."""
    fields = {k: v for k, v in reported.items() if not k.startswith("val_")}
    metrics = {k: v for k, v in reported.items() if k.startswith("val_")}
    return {**fields, "final_metrics": {**metrics, **(reported.get("final_metrics") or {})}}


class ExportedModel(BaseModel):
    """The model as exported (``export_onnx``'s result): the ONNX file and its input example, the
    TorchScript file and a recipe's extra files (a tokenizer) registered beside it, and how the export was
    held to PyTorch: parity on fixed inputs and the recipe's metric re-computed with onnxruntime. A custom
    command's has neither (the platform has no reference model for it). JSON only at the XCom boundary,
    where ``register`` holds it to the training it exported (:func:`held_export`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    onnx_path: str
    input_example: str  # an .npz, one row per ONNX input
    torchscript_path: str | None = None
    artifacts: dict[str, str] = {}  # registered beside the ONNX graph, by name
    parity: dict[str, Any] | None = None  # trainyard.export.onnx_export.Parity.to_dict()
    torchscript_parity: dict[str, Any] | None = None
    metric: str | None = None  # the recipe's metric, computed with PyTorch and with onnxruntime
    metric_torch: float | None = None
    metric_onnx: float | None = None
    details: dict[str, int | float] = {}  # a recipe's own figures (the translator's decode_mismatches)

    def files(self) -> list[str]:
        """The files it names: each must be the exported training's (:func:`held_export`)."""
        return [f for f in (self.onnx_path, self.input_example, self.torchscript_path, *self.artifacts.values()) if f]


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


def _files_under(root: Path, files: list[str], whose: str) -> None:
    """NotAllowed naming the first of ``files`` not below ``root`` (links resolved), as ``whose`` file."""
    from trainyard.teams import NotAllowed

    for file in files:
        if root not in Path(file).resolve().parents:
            raise NotAllowed(f"{file} is not a file of {whose}: this task's input was changed; trigger the job again")


def _job_files(spec: JobSpec, files: list[str]) -> None:
    """NotAllowed naming the first of ``files`` outside the job's own runs folder (``runs/<name>/``: a job
    name is its team's)."""
    root = (paths.runs_root() / spec.name).resolve()
    _files_under(root, files, f"job {spec.name!r} (its runs are under {root})")


def _held_to_run(spec: JobSpec, run_key: str, held: TrainingPlan | TrainingResult, own: Mapping[str, Path]) -> None:
    """NotAllowed unless each field of ``held`` named in ``own`` (and set) is that path, the run ``run_key``'s,
    and its MLflow run is one of the job's experiment tagged with that run key."""
    from trainyard.teams import NotAllowed
    from trainyard.tracking import mlflow_tracking as mt

    for field, path in own.items():
        given = getattr(held, field)
        if given is not None and Path(given).resolve() != path.resolve():
            raise NotAllowed(
                f"{field} {given} is not run {run_key}'s of job {spec.name!r} ({path}): this task's input was "
                "changed; trigger the job again"
            )
    tagged = _job_run(spec, held.mlflow_run_id).data.tags.get(mt.RUN_KEY_TAG)  # a run of the job's experiment ...
    if tagged != run_key:  # ... and this run key's
        raise NotAllowed(
            f"MLflow run {held.mlflow_run_id} is run {tagged}'s, not {run_key}'s: this task's input was changed; "
            "trigger the job again"
        )


def _job_run(spec: JobSpec, run_id: str) -> Run:
    """The MLflow run ``run_id``, read once; NotAllowed if it is not one of the job's experiment."""
    from trainyard.teams import NotAllowed
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    run = c.get_run(run_id)
    experiment = c.get_experiment(run.info.experiment_id).name
    if experiment != spec.name:
        raise NotAllowed(
            f"MLflow run {run_id} is one of {experiment!r}, not of job {spec.name!r}: this task's input was "
            "changed; trigger the job again"
        )
    return run


def held_training(spec: JobSpec, run_key: str, value: Mapping[str, Any] | TrainingResult) -> TrainingResult:
    """A later task's copy of the training's result (``training_result``'s XCom, which a user may write)
    as the record, held to the job's run ``run_key``: its run directory exactly the run's own, its model the
    one its workers leave there (``work/model.pt``, a custom command's ``work/model.onnx``: not another
    run's, whose lineage is another, nor a link its program left elsewhere in ``work/``), its MLflow run the
    run's. A sweep run's best trial is read from its study instead (:func:`trainyard.pipeline.trained_job`).
    NotAllowed naming what is not. Its metrics are not read after it: ``evaluate`` measures (a custom
    command's it reads again from its metrics file) and records them (:func:`held_evaluation`)."""
    from trainyard.training.run_config import work_dir

    held = from_xcom(TrainingResult, value, "training_result")
    _job_files(spec, held.files())  # the job's, first: a refusal then names the job
    own = run_dir(spec, run_key)
    work = Path(work_dir(str(own)))
    _held_to_run(
        spec, run_key, held, {"run_dir": own, "model_path": work / "model.pt", "onnx_path": work / "model.onnx"}
    )
    return held


def held_export(spec: JobSpec, trained: TrainingResult, value: Mapping[str, Any] | ExportedModel) -> ExportedModel:
    """``register``'s copy of ``export_onnx``'s result (an XCom, which a user may write) as the record,
    every file it names inside the directory of the training it exported (``trained``, held already).
    NotAllowed naming what is not."""
    held = from_xcom(ExportedModel, value, "export_onnx")
    _job_files(spec, held.files())
    own = Path(trained.run_dir).resolve()
    _files_under(own, held.files(), f"the training it exported ({own})")
    return held


EVALUATION_FILE = "evaluation.json"  # in the run's directory: what evaluate measured, and the gate's verdict on it


def trained_with(trained: TrainingResult) -> tuple[JobSpec, PreparedData]:
    """The JobSpec the training ``trained`` (held already) trained with and the prepared data it trained on,
    from the run config ``plan_training`` wrote in its run directory (its workers only read it): what the
    steps after training evaluate, gate, export and register by, not the spec and dataset XComs, which a
    member of the team may write (a split whose val rows are train rows, another commit)."""
    from trainyard.errors import PermanentError
    from trainyard.training.run_config import RUN_CONFIG_FILE, RunConfig

    cfg = RunConfig.load(Path(trained.run_dir) / RUN_CONFIG_FILE)
    if cfg.data is None:  # plan_training always writes it
        raise PermanentError(f"{trained.run_dir}/{RUN_CONFIG_FILE} names no prepared data: train the job again")
    return cfg.spec, cfg.data


def _model_digest(trained: TrainingResult) -> str | None:
    import hashlib

    model = trained.model_file()
    if model is None:
        return None
    with open(model, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def record_evaluation(run_key_dir: Path, trained: TrainingResult, metrics: Mapping[str, float]) -> None:
    """``evaluate``'s metrics, with the model they measured (its MLflow run, its file's SHA-256), in the
    evaluating run's directory ``run_key_dir`` (:func:`run_dir`: the platform's; its workers write in
    ``work/`` only, a sweep's trials in their own), where :func:`held_evaluation` reads them for the gate
    and the registration. A gate's verdict on them is added by :func:`record_verdict`."""
    record = {"metrics": dict(metrics), "mlflow_run_id": trained.mlflow_run_id, "model_sha256": _model_digest(trained)}
    _write_evaluation(run_key_dir, record)


def _write_evaluation(run_key_dir: Path, record: Mapping[str, Any]) -> None:
    import json

    from trainyard.files import atomic_write

    atomic_write(run_key_dir / EVALUATION_FILE, json.dumps(record, sort_keys=True).encode())


def _recorded(run_key_dir: Path) -> dict[str, Any]:
    import json

    from trainyard.errors import PermanentError

    try:
        return json.loads((run_key_dir / EVALUATION_FILE).read_text())
    except FileNotFoundError:
        raise PermanentError(
            f"evaluate recorded no metrics for this run ({run_key_dir / EVALUATION_FILE} is missing): clear "
            "evaluate so that it runs again"
        ) from None


def record_verdict(run_key_dir: Path, passed: bool) -> None:
    """The gate's verdict on the metrics :func:`record_evaluation` recorded (which it judged: read with
    :func:`held_evaluation`), beside them: ``register`` registers only what the gate passed."""
    _write_evaluation(run_key_dir, {**_recorded(run_key_dir), "gate_passed": passed})


def held_evaluation(
    run_key_dir: Path, trained: TrainingResult, value: Any, *, passed_gate: bool = False
) -> dict[str, float]:
    """The metrics ``evaluate`` recorded in the run's directory ``run_key_dir`` for the training
    ``trained`` (held already), which a later task gates on and registers: not its XCom ``value``, which a
    member of the team may write. NotAllowed where that XCom says otherwise, or the model is not the one
    measured (a training run again since); ``passed_gate``: also where the gate did not pass them (its
    state set by hand). PermanentError where ``evaluate`` recorded nothing."""
    import json

    from trainyard.teams import NotAllowed

    recorded = _recorded(run_key_dir)
    if (recorded.get("mlflow_run_id"), recorded.get("model_sha256")) != (trained.mlflow_run_id, _model_digest(trained)):
        raise NotAllowed(
            f"evaluate measured another model than the training in {trained.run_dir} has now: clear evaluate so "
            "that it measures this one"
        )
    metrics = recorded["metrics"]
    if not isinstance(value, Mapping):
        raise NotAllowed(
            "what this task was handed as evaluate's result is not a mapping of metrics: trigger the job again"
        )
    if json.loads(json.dumps(dict(value), sort_keys=True)) != metrics:
        changed = sorted(str(k)[:64] for k in {*value, *metrics} if value.get(k) != metrics.get(k))
        named = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
        raise NotAllowed(
            f"what this task was handed as evaluate's result is not what evaluate recorded for this run "
            f"({named} differ): evaluate's result was changed; trigger the job again"
        )
    if passed_gate and recorded.get("gate_passed") is not True:
        raise NotAllowed(
            "the gate has not passed the metrics evaluate recorded for this run (its task's state was set, or "
            "evaluate ran again after it): clear gate so that it judges them"
        )
    return metrics


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
    from trainyard.training.run_config import RUN_CONFIG_FILE

    held = from_xcom(TrainingPlan, plan, "plan_kubernetes")
    rdir = run_dir(spec, run_key)
    own = {"run_dir": rdir, "config_path": rdir / RUN_CONFIG_FILE, "tensorboard_dir": tensorboard_dir(spec, run_key)}
    _held_to_run(spec, run_key, held, own)
    return held
