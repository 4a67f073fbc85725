"""JobSpec: the single source of truth for one training job.

It enters as Airflow DAG Params (the UI form, generated from this module's JSON schema), as the REST
``conf``, or from a YAML file, is validated once by the first task and passed as this model from there on;
JSON only crosses XCom and the run-config file. Every default and description lives here, once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainyard import TRAINER_IMAGE
from trainyard.errors import PermanentError, spec_error_message
from trainyard.recipes.catalog import RECIPES as BUILT_IN_RECIPES
from trainyard.recipes.catalog import SOURCES

RECIPES = (*BUILT_IN_RECIPES, "custom")
SOURCE_CHOICES = (*SOURCES, "none")
NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"
MIG_PROFILE_RE = r"^[0-9]+g\.[0-9]+gb$"  # a MIG profile: 1g.10gb, 3g.40gb
MAX_HOURS_LIMIT = 24 * 31  # the longest resources.max_hours: a month (the cluster profile's Celery redelivery bound)


class SpecError(PermanentError, ValueError):
    """An invalid JobSpec; the message names every bad field and what is allowed. (Still a ValueError for
    callers that caught it as one.)"""


def _once_each(names: Iterable[str], rule: str) -> None:
    """ValueError ``<rule>; repeated: [...]`` naming those of ``names`` that occur more than once."""
    seen = list(names)
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
        raise ValueError(f"{rule}; repeated: {dupes}")


class _Model(BaseModel):
    # Unknown keys are typos far more often than intent: refuse them so the user hears about it.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetRef(_Model):
    """Which dataset, and which version of it, the job trains on."""

    store: Literal["local", "lakefs"] = Field(
        "local", description="dataset store: the embedded local store or lakeFS (connection lakefs_default)"
    )
    repo: str = Field("digits", pattern=NAME_RE, description="dataset repository in the store")
    ref: str = Field("main", min_length=1, description="branch, tag or commit id; resolved to a commit")
    format: Literal["lmdb", "tfrecord"] = Field("lmdb", description="record format the training loaders read")
    source: Literal[SOURCE_CHOICES] = Field(  # type: ignore[valid-type]
        "sklearn_digits",
        description=(
            "built-in source ingested into the store before resolving ("
            + ", ".join(f"{name} for {recipe}" for name, (recipe, _) in SOURCES.items())
            + "); 'none' = the data is already there (your own upload)"
        ),
    )
    memory_cache_mb: int = Field(
        512,
        ge=0,
        le=1 << 20,
        description=(
            "a split whose records file is at most this many MB is read into memory once per worker; a larger "
            "one is read batch by batch from the file, so memory does not grow with it (0: always from the file)"
        ),
    )
    loader_workers: int = Field(
        0,
        ge=0,
        le=64,
        description=(
            "DataLoader processes per training worker that read and decode batches ahead of the step "
            "(0: the training process reads them itself)"
        ),
    )


class SplitSpec(_Model):
    """Deterministic train/val/test split by a hash of each sample's key; train gets the rest."""

    val_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="share of samples in the val split")
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of samples in a test split (0 = none)")
    seed: int = Field(0, ge=0, description="salt of the key hash: another seed, another split")

    @model_validator(mode="after")
    def _leaves_training_data(self) -> SplitSpec:
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("val_fraction + test_fraction must be < 1 (train gets the rest)")
        return self


class Hyperparameters(_Model):
    """How the model is optimised; the same for every strategy."""

    epochs: int = Field(10, ge=1, le=1000, description="passes over the train split")
    batch_size: int = Field(32, ge=1, le=65536, description="samples per step on each worker")
    learning_rate: float = Field(0.1, gt=0.0, le=10.0, description="the optimizer's learning rate")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum (sgd only)")
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="optimizer")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="L2 penalty (sgd) or decoupled decay (adamw)")
    seed: int = Field(42, ge=0, description="seed of weight initialisation and data order")


class Distributed(_Model):
    """How the workers cooperate. ``ddp`` = torchrun + DistributedDataParallel; ``horovod`` = horovodrun
    (gloo) + DistributedOptimizer; ``deepspeed`` = torchrun + a ZeRO config made from here."""

    strategy: Literal["ddp", "horovod", "deepspeed"] = Field("ddp", description="how the workers cooperate")
    max_restarts: int = Field(
        1,
        ge=0,
        le=100,
        description="worker-group restarts after a crash (torchrun: ddp, deepspeed, custom; not horovod)",
    )
    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="training precision")
    compile: bool = Field(
        False,
        description=(
            "compile the model's training forward and backward with torch.compile (inductor): faster steps "
            "on GPUs after a compile of a minute or so at the start; ddp and horovod"
        ),
    )

    @model_validator(mode="after")
    def _compile_strategy(self) -> Distributed:
        if self.compile and self.strategy == "deepspeed":
            raise ValueError(
                "distributed.compile: DeepSpeed runs its own engine around the model; use strategy ddp or "
                "horovod to compile, or compile: false"
            )
        return self


class Checkpointing(_Model):
    """When to checkpoint: at the end of every epoch, or instead every N steps or every N minutes (one of
    the two); and how many to keep."""

    every_steps: int | None = Field(None, ge=1, description="checkpoint every N optimizer steps instead of every epoch")
    every_minutes: float | None = Field(None, gt=0, description="checkpoint every N minutes instead of every epoch")
    keep_last: int = Field(3, ge=1, le=1000, description="checkpoints kept; older ones are deleted")

    @model_validator(mode="after")
    def _one_interval(self) -> Checkpointing:
        if self.every_steps is not None and self.every_minutes is not None:
            raise ValueError("checkpointing: give every_steps or every_minutes, not both")
        return self


class Tracking(_Model):
    """How often the training loop records its curves (MLflow and TensorBoard)."""

    log_every_steps: int = Field(
        50,
        ge=1,
        le=100_000,
        description=(
            "steps per point of train_loss (their mean over the workers), train_lr and train_grad_norm; "
            "each epoch's end is a point too. 1 records every step, at a cost in the step's speed (the "
            "default is Lightning's; bench/loop.py measured 10 at 2-6 % of the digits recipe's speed)"
        ),
    )
    histogram_every_steps: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description=(
            "steps between per-layer histograms of the weights and gradients (TensorBoard's distributions "
            "and histograms); 0: none. Each is a copy of the model's parameters and gradients, turned into "
            "histograms off the step by the tracking thread"
        ),
    )


class Resources(_Model):
    """What the job needs. ``gpus_per_node`` is also the local process count, the Airflow pool_slots
    of the train task and, on Kubernetes, the pod's ``nvidia.com/gpu`` limit."""

    nodes: int = Field(
        1,
        ge=1,
        le=256,
        description=(
            "hosts the job trains on, gpus_per_node on each: on Kubernetes pods, locally workers of its GPU type "
            "(ddp and deepspeed)"
        ),
    )
    min_nodes: int | None = Field(
        None,
        ge=1,
        le=256,
        description=(
            "elastic multi-node ddp: the fewest nodes the training goes on with once some are lost, from its "
            "newest checkpoint (each worker keeps its batch_size, the learning rate follows the global batch, "
            "the cosine schedule ends with the steps left; a node that comes back rejoins); empty: all of "
            "them, and a lost node's return is waited for"
        ),
    )
    gpus_per_node: int = Field(2, ge=1, le=64, description="worker processes (GPUs) on each node")
    gpu_type: str = Field("cpu", pattern=NAME_RE, description="a key of resources.yaml gpu_types")
    mig_profile: str | None = Field(
        None,
        pattern=MIG_PROFILE_RE,
        description=(
            "on a GPU type partitioned with MIG, the slice each GPU of the job is (e.g. 1g.10gb, one of the "
            "type's mig_profiles): gpus_per_node counts these slices"
        ),
    )
    team: str = Field("default", pattern=NAME_RE, description="a key of resources.yaml teams")
    priority: int = Field(
        1, ge=1, le=1000, description="order among waiting jobs; the train task's priority_weight is 1000 + this"
    )
    max_hours: float = Field(
        24.0,
        gt=0,
        le=MAX_HOURS_LIMIT,
        description=(
            "the longest the training may hold its GPUs, all tries together: its workers are stopped then, "
            "and price x max_hours x GPUs is the cost's worst case that the team's budget must cover"
        ),
    )

    expected_hours: float | None = Field(
        None,
        gt=0,
        le=MAX_HOURS_LIMIT,
        description=(
            "how long the training should take, all tries together: past it, the team is told once "
            "(notice long_training); the training goes on until max_hours"
        ),
    )

    @model_validator(mode="after")
    def _min_nodes_within_nodes(self) -> Resources:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be at most nodes ({self.nodes})")
        return self

    @property
    def elastic(self) -> bool:
        """Whether the training goes on with fewer nodes than it started with (``min_nodes`` < ``nodes``)."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    @model_validator(mode="after")
    def _expected_within_max(self) -> Resources:
        if self.expected_hours is not None and self.expected_hours >= self.max_hours:
            raise ValueError(
                f"expected_hours ({self.expected_hours:g}) must be below max_hours ({self.max_hours:g}), "
                "which stops the training"
            )
        return self

    @property
    def total_gpus(self) -> int:
        """All of the job's GPUs (nodes x gpus_per_node): its pool slots, its cost multiplier."""
        return self.nodes * self.gpus_per_node

    @property
    def slot_type(self) -> str:
        """What its slots are counted in: its GPU type, or on a MIG type its profile's slices
        (``a100-mig.1g.10gb``): the pool, the queue, the ledger's count, the price
        (:attr:`trainyard.scheduling.resources.ResourcesConfig.slot_types`)."""
        return slot_type_of(self.gpu_type, self.mig_profile)


class Threshold(_Model):
    """One gate: ``metric`` must be >= min and/or <= max."""

    metric: str = Field(pattern=r"^[a-z0-9_]+$", description="a metric the recipe reports, e.g. val_accuracy")
    min: float | None = Field(None, description="lowest value that passes")
    max: float | None = Field(None, description="highest value that passes")

    @model_validator(mode="after")
    def _has_bound(self) -> Threshold:
        if self.min is None and self.max is None:
            raise ValueError(f"gate on {self.metric!r} needs min or max")
        return self


def slot_type_of(gpu_type: str, mig_profile: str | None) -> str:
    """The type a job's slots are counted in: ``gpu_type``, or its MIG profile's slices, ``<type>.<profile>``
    (a GPU type's name has no '.')."""
    return f"{gpu_type}.{mig_profile}" if mig_profile else gpu_type


class KubernetesSpec(_Model):
    """Where and how the pods of a ``launcher: kubernetes`` job run."""

    namespace: str = Field(
        "trainyard",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="namespace of the Job, its pods and Service",
    )
    image: str = Field(TRAINER_IMAGE, min_length=1, description="the trainer image; `make image` builds the default")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="the containers' imagePullPolicy"
    )
    service_account: str | None = Field(None, description="service account of the pods (default: the namespace's)")
    priority_class: str | None = Field(None, description="Kubernetes PriorityClass name")
    node_selector: dict[str, str] = Field({}, description="added to the GPU type's selector from resources.yaml")
    tolerations: tuple[dict[str, Any], ...] = Field(
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        description="pod tolerations (Kubernetes Toleration objects)",
    )
    data_pvc: str = Field("trainyard-data", description="PVC mounted at TRAINYARD_HOME in every pod and on the worker")
    env: dict[str, str] = Field({}, description="extra environment variables of the training container")
    cpu_per_gpu: str = Field("4", description="CPU request and limit per GPU (a Kubernetes quantity)")
    memory_per_gpu: str = Field("16Gi", description="memory request and limit per GPU (a Kubernetes quantity)")
    schedule_timeout_s: int = Field(
        6 * 3600,
        ge=60,
        le=7 * 24 * 3600,
        description=(
            "how long the pods may wait to be scheduled (a cluster queue, quota, scale-up) before the try fails"
        ),
    )
    termination_grace_s: int | None = Field(
        None,
        ge=1,
        le=3600,
        description=(
            "seconds the pods have from SIGTERM (Kueue's preemption, a deletion) to SIGKILL to checkpoint and "
            "end (terminationGracePeriodSeconds, and TRAINYARD_PREEMPTION_GRACE_S in the container; a built-in "
            "trainer's torchrun kills its workers 30 s after the signal); default: resources.yaml "
            "scheduling.preemption.grace_seconds"
        ),
    )


class CustomCommand(_Model):
    """Bring your own training: an image and a command instead of a built-in recipe. The platform still
    provides the rendezvous environment (MASTER_ADDR, RANK, ...), TRAINYARD_DATA_DIR, TRAINYARD_CHECKPOINT_DIR,
    TRAINYARD_OUTPUT_DIR (write model.onnx there), TRAINYARD_METRICS_FILE (JSON lines:
    {"step": n, "name": value, ...}), TRAINYARD_HYPERPARAMETERS (the spec's hyperparameters as JSON) and, in
    a sweep trial, TRAINYARD_TRIAL_VERDICT_FILE (see trainyard.training.custom)."""

    command: tuple[str, ...] = Field(
        min_length=1, description="argv of the program (no shell), e.g. [python, train.py]"
    )
    image: str | None = Field(None, description="image to run it in on Kubernetes (default: kubernetes.image)")

    @field_validator("command")
    @classmethod
    def _program_first(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        # The command follows torchrun's own options locally: a leading '-' would be read as one of them.
        if not command[0] or command[0].startswith("-"):
            raise ValueError(f"the first item must be the program to run, not an option (got {command[0]!r})")
        return command


class ChampionRule(_Model):
    """The challenger must beat the version under the ``production`` alias on ``metric`` by ``margin``,
    both measured on this run's eval data (built-in recipes only: a custom model cannot be re-measured)."""

    metric: str = Field(pattern=r"^[a-z0-9_]+$", description="a metric the recipe reports, e.g. val_map")
    margin: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="how far the challenger must be ahead")
    higher_is_better: bool = Field(
        True,
        strict=True,
        description=(
            "true: the challenger needs >= champion + margin; false (a loss): <= champion - margin. "
            "Defaults to true, which suits every metric the built-in recipes report (accuracy, F1, "
            "mAP, BLEU, chrF); set false for a loss"
        ),
    )


class Backends(_Model):
    """Which implementation serves each concern."""

    launcher: Literal["local", "kubernetes"] = Field(
        "local", description="local: workers on the Airflow worker; kubernetes: an Indexed Job"
    )
    tracking: Literal["mlflow"] = Field("mlflow", description="experiment tracking")
    registry: Literal["mlflow"] = Field("mlflow", description="model registry")


class ExportSpec(_Model):
    """ONNX must match PyTorch on fixed inputs, each output tensor to within ``atol + rtol * scale`` where
    scale is that tensor's largest |value| in PyTorch (fp32 rounding grows with a model's magnitudes, not
    with one element's), and on the recipe's val metric re-computed with onnxruntime (val_accuracy,
    val_map, val_bleu) to within metric_tolerance. Each recipe's default rtol is measured
    (bench/export_parity.py, ``Recipe.export_rtol``): between its faithful exports and its exports with
    one hidden-layer weight moved by 3% of that layer's RMS weight."""

    rtol: float | None = Field(
        None,
        gt=0.0,
        le=0.1,
        description=(
            "largest allowed |onnx - torch| as a fraction of each output's largest |value| (its "
            "scale); unset: the recipe's measured default (2e-6 to 2e-5; a custom command's model is "
            "only checked to run, having no reference to compare with); "
            "raise it for much larger models"
        ),
    )
    atol: float = Field(
        1e-7, gt=0.0, description="absolute floor added to rtol * scale, for outputs whose scale is (near) zero"
    )
    # the alias choices include the field's own name, so construction by name works (the plugin cannot see that)
    metric_tolerance: float = Field(  # type: ignore[pydantic-alias]
        0.0,
        ge=0.0,
        le=100.0,
        description="in the metric's own units (BLEU: 0..100)",
        # its name before the detection and translation recipes, when the metric was always val accuracy
        validation_alias=AliasChoices("metric_tolerance", "accuracy_tolerance"),
    )
    torchscript: bool = Field(False, description="also write a traced TorchScript file, held to the same parity")


MAX_GRID_POINTS = 10_000  # a grid sweep's points (every ask walks them under the study's lock)
SWEEPABLE_HYPERPARAMETERS = ("epochs", "batch_size", "learning_rate", "momentum", "optimizer", "weight_decay", "seed")


class SearchParameter(_Model):
    """One dimension of a sweep's search space: a hyperparameter or a recipe option, by its path in the
    JobSpec (``hyperparameters.learning_rate``, ``recipe_options.d_model``)."""

    name: str = Field(
        pattern=r"^(hyperparameters|recipe_options)\.[a-z][a-z0-9_]{0,62}$",
        description="hyperparameters.<field> or recipe_options.<option>",
    )
    type: Literal["float", "int", "categorical"] = Field(description="how it is drawn")
    low: float | None = Field(None, allow_inf_nan=False, description="lowest value (float, int)")
    high: float | None = Field(None, allow_inf_nan=False, description="highest value (float, int), included")
    log: bool = Field(False, description="draw on a log scale (float, int; low must be > 0)")
    step: float | None = Field(None, gt=0, allow_inf_nan=False, description="spacing of the values (float, int)")
    choices: tuple[int | float | str | bool, ...] = Field((), description="the values (categorical)")

    @model_validator(mode="after")
    def _well_formed(self) -> SearchParameter:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError(f"sweep parameter {self.name}: a categorical parameter needs choices")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError(f"sweep parameter {self.name}: a categorical parameter takes choices only")
            if len(set(map(repr, self.choices))) != len(self.choices) or len(set(self.choices)) != len(self.choices):
                # by == too: Optuna finds a choice by equality, so 1, 1.0 and True are one value to it
                raise ValueError(f"sweep parameter {self.name}: repeated choices {list(self.choices)}")
            return self
        if self.choices:
            raise ValueError(f"sweep parameter {self.name}: choices are for type categorical; give low and high")
        if self.low is None or self.high is None:
            raise ValueError(f"sweep parameter {self.name}: a {self.type} parameter needs low and high")
        if not self.low < self.high:
            raise ValueError(f"sweep parameter {self.name}: empty range, low {self.low} must be < high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"sweep parameter {self.name}: a log scale needs low > 0 (got {self.low})")
        if self.log and self.step is not None:
            raise ValueError(f"sweep parameter {self.name}: give log or step, not both")
        if self.type == "int" and (
            not float(self.low).is_integer()
            or not float(self.high).is_integer()
            or (self.step is not None and not float(self.step).is_integer())
        ):
            raise ValueError(f"sweep parameter {self.name}: an int parameter needs whole low, high and step")
        return self

    @property
    def field(self) -> tuple[str, str]:
        """(section, key): ("hyperparameters", "learning_rate")."""
        section, key = self.name.split(".", 1)
        return section, key

    def bounds(self) -> tuple[Any, ...]:
        """The values that must each make a valid JobSpec: the ends of a range, every choice."""
        if self.type == "categorical":
            return self.choices
        assert self.low is not None and self.high is not None
        return (int(self.low), int(self.high)) if self.type == "int" else (self.low, self.high)


class Sweep(_Model):
    """A hyperparameter sweep: the job is trained once per trial with values drawn from ``parameters``,
    the trials reporting to one Optuna study; losing trials stop early; the best goes on through
    evaluate, gate, export and register. A sweep triggered again under the same name resumes its study."""

    name: str = Field(
        pattern=NAME_RE,
        description="the study's name within the team: a run with the same name adds trials to the same study",
    )
    parameters: tuple[SearchParameter, ...] = Field(min_length=1, description="the search space")
    objective: str = Field(
        "val_accuracy",
        pattern=r"^[a-z0-9_]+$",
        description=(
            "the metric each trial is judged by: a val metric the recipe reports after each epoch, or, for "
            "recipe custom, a metric the program reports once per epoch (lowercase letters, digits, '_')"
        ),
    )
    direction: Literal["maximize", "minimize"] = Field("maximize", description="better is higher or lower")
    trials: int = Field(8, ge=1, le=1000, description="trials this run adds to the study")
    parallelism: int = Field(2, ge=1, le=256, description="trials that hold their GPUs at once (at most)")
    sampler: Literal["tpe", "random", "grid"] = Field(
        "tpe",
        description="tpe: multivariate TPE (constant liar for parallel trials); random; grid (categorical only)",
    )
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="the sampler's seed")
    pruner: Literal["median", "successive_halving", "none"] = Field(
        "median", description="what stops a losing trial at an epoch's end: median of earlier trials, or ASHA"
    )
    warmup_epochs: int = Field(1, ge=0, le=1000, description="epochs every trial runs before it may be stopped")
    startup_trials: int = Field(
        2, ge=0, le=1000, description="finished trials before the median pruner stops any (TPE: before it models)"
    )
    constraints: tuple[Threshold, ...] = Field(
        (),
        description=(
            "limits on other metrics of the trial's result (e.g. val_loss max 0.5): a trial outside them is "
            "infeasible and never chosen as the best"
        ),
    )
    warm_start_from: str | None = Field(
        None, pattern=NAME_RE, description="an earlier sweep of the team whose finished trials seed a new study"
    )

    @field_validator("parameters")
    @classmethod
    def _unique_parameters(cls, parameters: tuple[SearchParameter, ...]) -> tuple[SearchParameter, ...]:
        _once_each((p.name for p in parameters), "one entry per parameter")
        for p in parameters:
            section, key = p.field
            if section == "hyperparameters" and key not in SWEEPABLE_HYPERPARAMETERS:
                raise ValueError(
                    f"sweep parameter {p.name}: hyperparameters has no {key!r}; "
                    f"one of {list(SWEEPABLE_HYPERPARAMETERS)}"
                )
        return parameters

    @model_validator(mode="after")
    def _sampler_fits(self) -> Sweep:
        if self.sampler == "grid" and any(p.type != "categorical" for p in self.parameters):
            raise ValueError("sweep.sampler grid: every parameter must be categorical (the grid is its choices)")
        if self.sampler == "grid":
            points = 1
            for p in self.parameters:
                points *= len(p.choices)
            if points > MAX_GRID_POINTS:
                raise ValueError(
                    f"sweep.sampler grid: {points} points, more than {MAX_GRID_POINTS}; sample a space that large "
                    "with tpe or random"
                )
        if self.warm_start_from == self.name:
            raise ValueError("sweep.warm_start_from: a sweep resumes its own study by its name; name another sweep")
        return self


class JobSpec(_Model):
    """One training job: what to train on which data, how, where, and what it must achieve."""

    name: str = Field("digits", pattern=NAME_RE, description="job name; also the registered model name")
    recipe: Literal[RECIPES] = Field(  # type: ignore[valid-type]
        "digits_cnn",
        description=(
            "what is trained: a built-in recipe (digits_cnn: small image classification; "
            "centernet_detector: COCO detection, mAP; transformer_translator: parallel text, BLEU/chrF; "
            "resnet_classifier: a folder of images per class, accuracy/top-5/macro-F1) or custom (your command)"
        ),
    )
    dataset: DatasetRef = DatasetRef()
    split: SplitSpec = SplitSpec()
    hyperparameters: Hyperparameters = Hyperparameters()
    resources: Resources = Resources()
    distributed: Distributed = Distributed()
    checkpointing: Checkpointing = Checkpointing()
    tracking: Tracking = Tracking()
    gates: tuple[Threshold, ...] = Field(
        (Threshold(metric="val_accuracy", min=0.9),),
        description="thresholds the model must meet to be exported and registered (metrics of the recipe)",
    )
    champion: tuple[ChampionRule, ...] = Field(
        (), description="champion/challenger rules against the 'production' version (built-in recipes only)"
    )
    backends: Backends = Backends()
    kubernetes: KubernetesSpec = KubernetesSpec()
    custom: CustomCommand | None = None
    export: ExportSpec = ExportSpec()
    recipe_options: dict[str, int | float | str | bool] = Field(
        {},
        description=(
            "options of the recipe, e.g. {image_size: 64} (centernet_detector) or {d_model: 64} "
            "(transformer_translator); each recipe's options model holds their defaults and bounds"
        ),
    )
    sweep: Sweep | None = Field(
        None,
        description=(
            "a hyperparameter sweep instead of one training: trials of this job with values drawn from the "
            "search space, losers stopped early, the best registered (null: one training)"
        ),
    )

    replay_of: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9._-]{0,62}:[1-9][0-9]{0,8}$",
        description=(
            "MODEL:VERSION, set by `trainyard replay`: the run trains and evaluates as that registered version "
            "did, and exports and registers nothing (null: an ordinary run)"
        ),
    )
    replay_exact: bool = Field(
        True,
        description=(
            "with replay_of: the training task refuses to train where its code version or installed "
            "dependencies differ from those the version trained with (false: it trains and records what differs)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _mig_profile_moved(cls, data: Any) -> Any:
        """``kubernetes.mig_profile`` of a spec written before the profile moved to ``resources`` (a stored
        run config, a registered version to replay, an old run's conf): taken to its new place (null: left
        out), refused only where both places name different profiles."""
        if not isinstance(data, dict) or not isinstance(data.get("kubernetes"), dict):
            return data
        if "mig_profile" not in data["kubernetes"]:
            return data
        kubernetes = dict(data["kubernetes"])
        profile = kubernetes.pop("mig_profile")
        if profile is None:
            return {**data, "kubernetes": kubernetes}
        resources = dict(data.get("resources") or {})
        if resources.get("mig_profile") not in (None, profile):
            raise ValueError(
                f"kubernetes.mig_profile ({profile!r}) and resources.mig_profile ({resources['mig_profile']!r}) "
                "differ: name the profile once, in resources.mig_profile"
            )
        return {**data, "kubernetes": kubernetes, "resources": {**resources, "mig_profile": profile}}

    def headline(self) -> str:
        """What a run of this job is called where runs are listed (the note of its Airflow run): "digits:
        digits_cnn on 2 x a100, team vision", and a sweep's or a replay's mark."""
        res = self.resources
        words = f"{self.name}: {self.recipe} on {res.total_gpus} x {res.slot_type}, team {res.team}"
        if self.sweep is not None:
            words += f", sweep of {self.sweep.trials} trials"
        return words + (f", replay of {self.replay_of}" if self.replay_of else "")

    @field_validator("gates")
    @classmethod
    def _unique_gates(cls, gates: tuple[Threshold, ...]) -> tuple[Threshold, ...]:
        _once_each((g.metric for g in gates), "one gate per metric")
        return gates

    @model_validator(mode="after")
    def _launcher_fits(self) -> JobSpec:
        one_node_only = self.recipe == "custom" or self.distributed.strategy == "horovod" or self.sweep is not None
        if self.backends.launcher == "local" and self.resources.nodes > 1 and one_node_only:
            raise ValueError(
                "resources.nodes > 1 with backends.launcher 'local' trains a built-in recipe with "
                "distributed.strategy 'ddp' or 'deepspeed', one job (no sweep); a custom command or horovod "
                "on several nodes needs backends.launcher 'kubernetes'"
            )
        if self.resources.elastic and (self.recipe == "custom" or self.distributed.strategy != "ddp"):
            raise ValueError(
                "resources.min_nodes below resources.nodes (elastic) needs a built-in recipe with distributed.strategy "
                "'ddp': a custom program, horovod and deepspeed's sharded states cannot go on with fewer workers; "
                "leave min_nodes empty"
            )
        if self.resources.elastic and self.distributed.max_restarts == 0:
            raise ValueError(
                "resources.min_nodes below resources.nodes (elastic) needs distributed.max_restarts of 1 or more: "
                "each node lost uses one restart of the nodes left"
            )
        if self.recipe == "custom" and self.custom is None:
            raise ValueError("recipe 'custom' needs the custom section (command, optional image)")
        return self


def format_errors(err: ValidationError) -> str:
    lines = []
    errors = err.errors()
    for e in errors:
        loc = ".".join(str(p) for p in e["loc"]) or "(spec)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "too_short" and any(o["loc"][: len(e["loc"])] == e["loc"] and o is not e for o in errors):
            continue  # a list left short by its bad items: the items' own errors say it
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"must be one of {e['ctx']['expected']}"
        if e["type"] == "missing":
            lines.append(f"{loc}: required")
        elif not e["loc"]:  # a rule across fields: the message names them
            lines.append(msg)
        else:
            lines.append(f"{loc}: {msg} (got {e.get('input')!r})")
    return spec_error_message(lines)


def parse_spec(data: dict[str, Any] | None) -> JobSpec:
    """Validate a raw dict (Params, REST conf, YAML) into a JobSpec, or raise SpecError naming the fields."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(spec_error_message([f"(spec): expected a mapping, got {type(data).__name__}"]))
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err)) from None


def load_spec_file(path: str) -> JobSpec:
    import yaml

    with open(path, encoding="utf-8") as fh:
        return parse_spec(yaml.safe_load(fh))


SPEC_DIGEST_TAG = "spec.sha256"  # on a run and its registered version: the identity of the spec it trained


# Fields that say how a run is checked, not what it trains: left out of the identity of what is trained (a
# field added with its default would otherwise change every spec's digest and retrain every job once)
NOT_TRAINED = {"replay_exact"}


def spec_digest(spec: JobSpec) -> str:
    """The identity of what a run trains: SHA-256 of the spec's canonical JSON (every field, defaults
    included, so a default that changes between versions of trainyard counts as a change)."""
    raw = spec.model_dump(mode="json", exclude=NOT_TRAINED)
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def safe_key(text: str) -> str:
    """A filesystem-safe form of an identifier such as an Airflow run id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:200]
