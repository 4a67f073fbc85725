"""JobSpec: the single source of truth for one training job.

It enters as Airflow DAG Params (the UI form), as the REST ``conf``, or from a YAML file, is validated
once by the first task and then passed as a plain dict to every later task.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainyard import TRAINER_IMAGE

RECIPES = ("digits_cnn", "centernet_detector", "transformer_translator", "custom")
NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class SpecError(ValueError):
    """An invalid JobSpec; the message names every bad field and what is allowed."""


class _Model(BaseModel):
    # Unknown keys are typos far more often than intent: refuse them so the user hears about it.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetRef(_Model):
    """Which dataset, and which version of it, the job trains on."""

    store: Literal["local", "lakefs"] = "local"
    repo: str = Field("digits", pattern=NAME_RE)
    ref: str = Field("main", min_length=1, description="branch, tag or commit id; resolved to a commit")
    format: Literal["lmdb", "tfrecord"] = Field("lmdb", description="record format the training loaders read")
    source: Literal["sklearn_digits", "synthetic_shapes", "synthetic_translation", "none"] = Field(
        "sklearn_digits",
        description="built-in source ingested into the store before resolving (sklearn_digits for digits_cnn, "
        "synthetic_shapes for centernet_detector, synthetic_translation for transformer_translator); "
        "'none' = the data is already there (your own upload)",
    )


class SplitSpec(_Model):
    """Deterministic train/val/test split by a hash of each sample's key; train gets the rest."""

    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _leaves_training_data(self) -> "SplitSpec":
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("val_fraction + test_fraction must be < 1 (train gets the rest)")
        return self


class Hyperparameters(_Model):
    epochs: int = Field(10, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=65536)
    learning_rate: float = Field(0.1, gt=0.0, le=10.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD only")
    optimizer: Literal["sgd", "adamw"] = "sgd"
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = Field(42, ge=0)


class Distributed(_Model):
    """How the workers cooperate. ``ddp`` = torchrun + DistributedDataParallel; ``horovod`` = horovodrun
    (gloo) + DistributedOptimizer; ``deepspeed`` = the deepspeed launcher + a ZeRO config made from here."""

    strategy: Literal["ddp", "horovod", "deepspeed"] = "ddp"
    max_restarts: int = Field(1, ge=0, le=100, description="worker-group restarts after a crash (torchrun)")
    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"


class Checkpointing(_Model):
    """When to checkpoint (default: every epoch) and how many to keep."""

    every_steps: int | None = Field(None, ge=1)
    every_minutes: float | None = Field(None, gt=0)
    keep_last: int = Field(3, ge=1, le=1000)


class Resources(_Model):
    """What the job needs. ``gpus_per_node`` is also the local process count, the Airflow pool_slots
    of the train task and, on Kubernetes, the pod's ``nvidia.com/gpu`` limit."""

    nodes: int = Field(1, ge=1, le=256, description="> 1 needs the kubernetes launcher")
    gpus_per_node: int = Field(2, ge=1, le=64)
    gpu_type: str = Field("cpu", pattern=NAME_RE, description="a key of resources.yaml gpu_types")
    team: str = Field("default", pattern=NAME_RE)
    priority: int = Field(1, ge=1, le=1000, description="Airflow priority_weight of the train task")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Threshold(_Model):
    """One gate: ``metric`` must be >= min and/or <= max."""

    metric: str = Field(pattern=r"^[a-z0-9_]+$")
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _has_bound(self) -> "Threshold":
        if self.min is None and self.max is None:
            raise ValueError(f"gate on {self.metric!r} needs min or max")
        return self


class KubernetesSpec(_Model):
    """Where and how the pods of a ``launcher: kubernetes`` job run."""

    namespace: str = Field("trainyard", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    image: str = Field(TRAINER_IMAGE, min_length=1, description="the trainer image; `make image` builds the default")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str | None = None
    priority_class: str | None = Field(None, description="Kubernetes PriorityClass name")
    node_selector: dict[str, str] = Field({}, description="added to the GPU type's selector from resources.yaml")
    tolerations: tuple[dict[str, Any], ...] = (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )
    mig_profile: str | None = Field(None, pattern=r"^[0-9]+g\.[0-9]+gb$", description="e.g. 1g.10gb -> nvidia.com/mig-1g.10gb")
    data_pvc: str = Field("trainyard-data", description="PVC mounted at TRAINYARD_HOME in every pod and on the worker")
    env: dict[str, str] = {}
    cpu_per_gpu: str = "4"
    memory_per_gpu: str = "16Gi"
    schedule_timeout_s: int = Field(
        6 * 3600, ge=60, le=7 * 24 * 3600,
        description="how long the pods may wait to be scheduled (a cluster queue, quota, scale-up) before the try fails")


class CustomCommand(_Model):
    """Bring your own training: an image and a command instead of a built-in recipe. The platform still
    provides the rendezvous environment (MASTER_ADDR, RANK, ...), TRAINYARD_DATA_DIR,
    TRAINYARD_CHECKPOINT_DIR and TRAINYARD_METRICS_FILE (JSON lines: {"step": n, "name": value, ...})."""

    command: tuple[str, ...] = Field(min_length=1)
    image: str | None = None


class ChampionRule(_Model):
    """The challenger must beat the version under the ``production`` alias on ``metric`` by ``margin``,
    both measured on this run's eval data."""

    metric: str = Field(pattern=r"^[a-z0-9_]+$")
    margin: float = Field(0.0, ge=0.0)
    higher_is_better: bool = True


class Backends(_Model):
    launcher: Literal["local", "kubernetes"] = "local"
    tracking: Literal["mlflow"] = "mlflow"
    registry: Literal["mlflow"] = "mlflow"


class ExportSpec(_Model):
    """ONNX must match PyTorch on fixed inputs (numpy.isclose with rtol/atol) and on the recipe's val
    metric re-computed with onnxruntime (val_accuracy, val_map, val_bleu) to within metric_tolerance."""

    rtol: float = Field(1e-3, gt=0.0)
    atol: float = Field(1e-5, gt=0.0)
    metric_tolerance: float = Field(
        0.0, ge=0.0, le=100.0, description="in the metric's own units (BLEU: 0..100)",
        # its name before the detection and translation recipes, when the metric was always val accuracy
        validation_alias=AliasChoices("metric_tolerance", "accuracy_tolerance"))
    torchscript: bool = Field(False, description="also write a traced TorchScript file, held to the same parity")


class JobSpec(_Model):
    name: str = Field("digits", pattern=NAME_RE, description="job name; also the registered model name")
    recipe: Literal[RECIPES] = "digits_cnn"  # type: ignore[valid-type]
    dataset: DatasetRef = DatasetRef()
    split: SplitSpec = SplitSpec()
    hyperparameters: Hyperparameters = Hyperparameters()
    resources: Resources = Resources()
    distributed: Distributed = Distributed()
    checkpointing: Checkpointing = Checkpointing()
    gates: tuple[Threshold, ...] = (Threshold(metric="val_accuracy", min=0.9),)
    champion: tuple[ChampionRule, ...] = Field((), description="champion/challenger rules against 'production'")
    backends: Backends = Backends()
    kubernetes: KubernetesSpec = KubernetesSpec()
    custom: CustomCommand | None = None
    export: ExportSpec = ExportSpec()
    recipe_options: dict[str, int | float | str | bool] = Field(
        {}, description="options of the recipe (e.g. image_size, d_model); each recipe documents its own")

    @field_validator("gates")
    @classmethod
    def _unique_gates(cls, gates: tuple[Threshold, ...]) -> tuple[Threshold, ...]:
        seen = [g.metric for g in gates]
        dupes = sorted({m for m in seen if seen.count(m) > 1})
        if dupes:
            raise ValueError(f"one gate per metric; repeated: {dupes}")
        return gates

    @model_validator(mode="after")
    def _launcher_fits(self) -> "JobSpec":
        if self.backends.launcher == "local" and self.resources.nodes > 1:
            raise ValueError("resources.nodes > 1 needs backends.launcher = 'kubernetes' (local runs one node)")
        if self.recipe == "custom" and self.custom is None:
            raise ValueError("recipe 'custom' needs the custom section (command, optional image)")
        return self

    @property
    def model_name(self) -> str:
        return self.name


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(spec)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"must be one of {e['ctx']['expected']}"
        if e["type"] == "missing":
            lines.append(f"{loc}: required")
        elif not e["loc"]:  # a rule across fields: the message names them
            lines.append(msg.removeprefix("Value error, "))
        else:
            lines.append(f"{loc}: {msg} (got {e.get('input')!r})")
    return "invalid JobSpec:\n  " + "\n  ".join(lines)


def parse_spec(data: dict[str, Any] | None) -> JobSpec:
    """Validate a raw dict (Params, REST conf, YAML) into a JobSpec, or raise SpecError naming the fields."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"invalid JobSpec: expected a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_errors(err)) from None


def load_spec_file(path: str) -> JobSpec:
    import yaml

    with open(path, encoding="utf-8") as fh:
        return parse_spec(yaml.safe_load(fh))


def spec_digest(spec: JobSpec) -> str:
    """Short stable digest of a spec, for keys derived from inputs."""
    import hashlib
    import json

    raw = json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def safe_key(text: str) -> str:
    """A filesystem-safe form of an identifier such as an Airflow run id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:200]
