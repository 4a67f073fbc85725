"""The interface every built-in recipe implements (:class:`Recipe`, with its options model): what the
registry, the pipeline and the trainers know of a recipe. The helpers the built-in recipes share are in
:mod:`trainyard.recipes.shared`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from trainyard.errors import spec_error_message
from trainyard.export.onnx_export import DEFAULT_RTOL
from trainyard.spec import ExportSpec, JobSpec, SpecError

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData
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
    # exports with one weight moved (bench/export_parity.py --runs 20, recorded in docs/jobs.md); the
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
        self, model_path: str, data: PreparedData, split: str, options: OptionsT
    ) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics prefixed with ``split``, info such as metric signatures) of a model file on a split."""
        raise NotImplementedError

    def export(self, model_path: str, data: PreparedData, out_dir: Path, export: ExportSpec, options: OptionsT) -> dict:
        """ONNX file + parity + the metric re-computed with onnxruntime; raises ExportFailed."""
        raise NotImplementedError

    def onnx_metrics(self, onnx_path: Path, data: PreparedData, options: OptionsT) -> dict[str, float]:
        """The val metrics of an ONNX model of this recipe (for champion/challenger)."""
        raise NotImplementedError
