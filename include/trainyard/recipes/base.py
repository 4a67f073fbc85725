"""The interface every built-in recipe implements, and the helpers they share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from trainyard.errors import spec_error_message
from trainyard.export.onnx_export import DEFAULT_RTOL
from trainyard.spec import ExportSpec, JobSpec, SpecError

if TYPE_CHECKING:
    from trainyard.training.data import RecordDataset
    from trainyard.training.run_config import RunConfig


class Options(BaseModel):
    """Base of each recipe's options model (``recipe_options``): one field per option, with its default,
    bounds and description in one place. Strict, so ``"64"`` or ``true`` is not taken for an int (an int
    is still taken for a float); unknown keys are refused, as everywhere in the JobSpec."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def options_problems(recipe: str, model: type[Options], err: ValidationError) -> list[str]:
    """A ValidationError of ``model`` as ``recipe_options.<key>`` lines that say what is allowed."""
    takes = sorted(model.model_fields)
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"recipe_options.{key}: not an option of recipe {recipe!r}; it takes {takes or 'none'}")
        elif not e["loc"]:  # a rule across options: its message names them
            lines.append(f"recipe_options: {e['msg'].removeprefix('Value error, ')}")
        else:
            field = model.model_fields[str(e["loc"][0])]  # an options model's fields are named by strings
            lines.append(
                f"recipe_options.{key}: {e['msg'].removeprefix('Value error, ')} (got {e['input']!r}); "
                f"{key} is {field.description} (default {field.default!r})"
            )
    return lines


OptionsT = TypeVar("OptionsT", bound=Options)


class Recipe(Generic[OptionsT]):
    """One kind of training job, end to end. Subclasses set the class attributes and implement the rest.

    Worker side (inside torchrun / horovodrun / deepspeed processes): ``load``, ``build_model``, ``loss``,
    ``val_metrics``, ``model_blob``. Task side (Airflow tasks, the CLI): the data, evaluation and export
    methods. Inputs are the typed spec parts (``JobSpec``, the recipe's ``Options``, ``ExportSpec``, the
    worker's ``RunConfig``) and plain paths and manifests, so each piece runs without Airflow.
    """

    name: str = ""
    data_kind: str = ""  # the dataset layout, and so the expectation suites
    options_model: type[OptionsT]  # recipe_options: names, types, defaults, bounds, descriptions
    metrics: tuple[str, ...] = ()  # what ``evaluate`` reports, as <split>_<name>: what gates may name
    # what ``val_metrics`` reports after every epoch, as val_<name>: what a sweep's trials are judged by
    epoch_metrics: tuple[str, ...] = ()
    # the export gate's rtol when export.rtol is unset: between the recipe's faithful exports and its
    # exports with one weight moved (bench/export_parity.py --runs 20, recorded in the README); the
    # translation recipe keeps this default, which is its own measured one
    export_rtol: float = DEFAULT_RTOL

    # -- spec ----------------------------------------------------------------------------------------------
    def option_problems(self, given: Mapping[str, Any]) -> list[str]:
        """One ``recipe_options.<key>: what is wrong; what is allowed`` line per problem (none = valid), as
        validate_spec checks them; a recipe adds what depends on this host (a file that must exist)."""
        try:
            self.options_model.model_validate(dict(given))
        except ValidationError as err:
            return options_problems(self.name, self.options_model, err)
        return []

    def opts(self, spec: JobSpec) -> OptionsT:
        """The recipe's options of ``spec`` with their defaults filled in; SpecError naming each bad one.
        Parsing only: every step calls it, and a later step must not fail on what validate_spec checked."""
        try:
            return self.options_model.model_validate(dict(spec.recipe_options))
        except ValidationError as err:
            raise SpecError(spec_error_message(options_problems(self.name, self.options_model, err))) from None

    def worker_inputs(self, options: OptionsT) -> list[Path]:
        """Files the workers read besides the prepared data and the run config (a sandboxed worker may read
        these and nothing else of the platform's)."""
        return []

    @property
    def sources(self) -> dict[str, str]:
        """The built-in dataset.source names of this recipe -> their ingest function (``catalog.SOURCES``)."""
        from trainyard.recipes.catalog import SOURCES

        return {name: ingest for name, (recipe, ingest) in SOURCES.items() if recipe == self.name}

    # -- data ----------------------------------------------------------------------------------------------
    def ingest(self, source: str, store, repo: str, branch: str = "main"):
        import importlib

        if source not in self.sources:
            raise ValueError(
                f"dataset.source {source!r} does not fit recipe {self.name!r}; "
                f"use one of {sorted(self.sources) + ['none']}"
            )
        module, fn = self.sources[source].split(":")
        return getattr(importlib.import_module(module), fn)(store, repo, branch)

    def validate(self, dataset_dir: Path, docs_dir: Path | None):
        """The dataset's expectation suites -> a ValidationReport (Data Docs under ``docs_dir``)."""
        raise NotImplementedError

    def samples(self, dataset_dir: Path, options: OptionsT) -> tuple[list[str], Callable[[str], tuple], dict]:
        """(sample keys, key -> record tuple, meta) for ``prepare_records``."""
        raise NotImplementedError

    def variant(self, options: OptionsT) -> str:
        """What besides the commit and split shapes the prepared records (part of the cache key)."""
        return self.name

    # -- training (workers) --------------------------------------------------------------------------------
    def load(self, cfg: RunConfig) -> tuple[RecordDataset, Any, dict]:
        """(train split as batches of tensors, val data for ``val_metrics``, meta for ``build_model``): the
        splits through :func:`trainyard.training.data.load_split`, streamed or held by its size."""
        raise NotImplementedError

    def build_model(self, meta: dict, options: OptionsT) -> torch.nn.Module:
        raise NotImplementedError

    def loss(self, model, batch: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def val_metrics(self, model, val, device: torch.device, dtype: torch.dtype = torch.float32) -> dict[str, float]:
        raise NotImplementedError

    def model_blob(self, model: torch.nn.Module, meta: dict) -> dict:
        """What model.pt holds: enough to rebuild the model with no other file."""
        return {"recipe": self.name, "config": model.config, "state_dict": model.state_dict()}

    def model_from_blob(self, blob: dict) -> torch.nn.Module:
        raise NotImplementedError

    # -- evaluation and export (tasks) ---------------------------------------------------------------------
    def evaluate(
        self, model_path: str, data: dict, split: str, options: OptionsT
    ) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics prefixed with ``split``, info such as metric signatures) of a model file on a split."""
        raise NotImplementedError

    def export(self, model_path: str, data: dict, out_dir: Path, export: ExportSpec, options: OptionsT) -> dict:
        """ONNX file + parity + the metric re-computed with onnxruntime; raises ExportFailed."""
        raise NotImplementedError

    def onnx_metrics(self, onnx_path: Path, data: dict, options: OptionsT) -> dict[str, float]:
        """The val metrics of an ONNX model of this recipe (for champion/challenger)."""
        raise NotImplementedError


class Classifier(Recipe[OptionsT]):
    """The worker half of a classification recipe: batches of (inputs, labels), a model that returns
    logits, cross-entropy, and val accuracy and loss every epoch over ``val_batch``-sized batches of the
    val split (a ``RecordDataset``)."""

    val_batch = 512
    epoch_metrics = ("accuracy", "loss")

    def loss(self, model, batch: list[torch.Tensor]) -> torch.Tensor:
        import torch.nn.functional as F

        x, y = batch
        return F.cross_entropy(model(x).float(), y)

    def val_metrics(self, model, val, device: torch.device, dtype: torch.dtype = torch.float32) -> dict[str, float]:
        from trainyard.training.common import evaluate

        acc, loss = evaluate(model, (to_device(b, device, dtype) for b in val.batches(self.val_batch)))
        return {"val_accuracy": acc, "val_loss": loss}


def to_device(batch, device: torch.device, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Move a batch. The model's input (the first tensor) takes the training dtype (bf16 under DeepSpeed)
    when it is floating; targets keep theirs: a bf16 Gaussian heatmap would round 0.998 to a false 1.0.
    The copies to a GPU do not wait (from the pinned memory the training DataLoader hands out, they overlap
    the work queued before them); the kernels that read the batch are queued after them on the stream."""
    first, *rest = batch
    if first.is_floating_point():
        first = first.to(device, dtype, non_blocking=True)
    else:
        first = first.to(device, non_blocking=True)
    return [first, *(t.to(device, non_blocking=True) for t in rest)]


def read_split(data: dict, split: str):
    """(keys, labels, arrays, meta, targets) of a prepared split."""
    from trainyard.data import formats

    return formats.read_with_targets(data["format"], data[split])


def companion_model(onnx_path) -> torch.nn.Module:
    """The PyTorch model registered next to an ONNX file (``pytorch/model.pt`` in a version's files): what
    the ONNX graph alone does not hold (vocabularies, categories, input size)."""
    from trainyard.recipes import load_model

    found = sorted(Path(onnx_path).parent.rglob("model.pt"))
    if not found:
        raise ValueError(f"no model.pt next to {onnx_path}: a registered version carries pytorch/model.pt")
    return load_model(found[0])


def metric_drop(name: str, torch_value: float, onnx_value: float, tolerance: float) -> str | None:
    """A problem line when the ONNX model's metric differs from PyTorch's by more than ``tolerance``."""
    if abs(torch_value - onnx_value) > tolerance + 1e-12:
        return f"{name} onnx {onnx_value:.4f} != torch {torch_value:.4f} (tolerance {tolerance})"
    return None


def flat(outputs) -> np.ndarray:
    """Several output arrays as one flat float64 vector, for one parity figure over all of them."""
    return np.concatenate([np.asarray(o, dtype=np.float64).ravel() for o in outputs])


def save_input_example(out_dir: Path, feeds: dict[str, np.ndarray]) -> str:
    """The registered model's input example (one row per ONNX input), kept with the run as .npz."""
    path = Path(out_dir) / "input_example.npz"
    arrays = {k: v[:1] for k, v in feeds.items()}
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub: any **kwds key could be allow_pickle (bool)
    return str(path)


def load_input_example(path: str) -> dict[str, np.ndarray] | np.ndarray:
    with np.load(path) as npz:
        feeds = {k: npz[k] for k in npz.files}
    return next(iter(feeds.values())) if len(feeds) == 1 else feeds


def verify_export(
    *,
    onnx_path: Path,
    torch_outputs,
    onnx_outputs,
    export: ExportSpec | dict,
    default_rtol: float,
    metric: str,
    torch_metric: float,
    onnx_metric: float,
    model=None,
    inputs=None,
    out_dir: Path | None = None,
    extra: dict | None = None,
    problems: list[str] | None = None,
) -> dict:
    """The export verdict every recipe shares: output parity (each output against its own scale, see
    ``check_parity``), the metric re-computed with onnxruntime (within ``export.metric_tolerance``), and
    with ``export.torchscript`` a TorchScript file traced on ``inputs`` (the tensors ``torch_outputs`` came
    from) and held to the same parity. ``torch_outputs`` and ``onnx_outputs`` are lists in the ONNX graph's
    output order; the problems name outputs by the graph's names. Raises ExportFailed listing every problem
    (with the record attached); else the JSON-able record. ``default_rtol``: the recipe's, for an unset
    ``export.rtol``."""
    import onnx

    from trainyard.export.onnx_export import ExportFailed, check_parity, export_torchscript, torchscript_predict

    # TRANSITION: the ExportSpec (typed callers) or its JSON dict (pipeline steps); validating the dict
    # here fills its defaults from the one place they live.
    export = ExportSpec.model_validate(export)
    rtol = export.rtol if export.rtol is not None else default_rtol
    names = [o.name for o in onnx.load(str(onnx_path), load_external_data=False).graph.output]
    if len(names) != len(torch_outputs):
        names = [f"output{i}" for i in range(len(torch_outputs))]
    problems = list(problems or [])
    parity = check_parity(list(torch_outputs), list(onnx_outputs), rtol, export.atol, names)
    parity_problem = parity.problem("ONNX")  # None when every output agrees
    if parity_problem:
        problems.append(parity_problem)
    drop = metric_drop(metric, torch_metric, onnx_metric, export.metric_tolerance)
    if drop:
        problems.append(drop)
    out = {
        "onnx_path": str(onnx_path),
        "parity": parity.to_dict(),
        "metric": metric,
        f"{metric}_torch": torch_metric,
        f"{metric}_onnx": onnx_metric,
        **(extra or {}),
    }
    if export.torchscript and model is not None:
        assert out_dir is not None, "verify_export: a TorchScript check (model given) needs out_dir"
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        ts_path = export_torchscript(model, inputs, Path(out_dir) / "model.torchscript.pt")
        ts = check_parity(
            list(torch_outputs),
            torchscript_predict(ts_path, *(t.numpy() for t in inputs)),
            rtol,
            export.atol,
            names,
        )
        ts_problem = ts.problem("TorchScript")
        if ts_problem:
            problems.append(ts_problem)
        out.update(torchscript_path=str(ts_path), torchscript_parity=ts.to_dict())
    if problems:
        raise ExportFailed("export rejected: " + "; ".join(problems), record=out)
    return out
