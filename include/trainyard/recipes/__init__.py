"""Built-in recipes: what turns a dataset kind into a trained, measured, exported model.

A recipe bundles, for one kind of task, the dataset layout and its validation suite, the records
written at preparation, the model and its loss (used by every distributed strategy's loop), the
evaluation metric, and the ONNX export with its parity and metric re-check. The pipeline and the
trainers only ever talk to a recipe through :class:`trainyard.recipes.base.Recipe`.

======================== ====================== ============================== =====================
recipe                   data layout            model                          metrics
======================== ====================== ============================== =====================
``digits_cnn``           image classification   small CNN                      val_accuracy, macro F1
``centernet_detector``   COCO detection         small CenterNet                COCO mAP (faster-coco-eval)
``transformer_translator`` parallel text        encoder-decoder transformer    BLEU, chrF (sacrebleu)
``resnet_classifier``    image folder (photos)  ResNet-10/18/34/50             accuracy, top-5, macro F1
======================== ====================== ============================== =====================
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.recipes.catalog import RECIPES

if TYPE_CHECKING:
    from trainyard.recipes.base import Recipe
    from trainyard.spec import JobSpec


def get(name: str) -> Recipe[Any]:
    """The recipe object for a JobSpec's ``recipe`` (not for 'custom', which brings its own program)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; built-in recipes: {sorted(RECIPES)}")
    module, cls = RECIPES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def worker_inputs(spec: JobSpec) -> list[Path]:
    """The files a built-in recipe's workers read besides the prepared data and the run config (resnet's
    ``init_weights``): what the sandbox and a pod are given to read; none for a custom command."""
    if spec.recipe == "custom":
        return []
    recipe = get(spec.recipe)
    return list(recipe.worker_inputs(recipe.opts(spec)))


def load_model(path):
    """A trained model file (any built-in recipe) as an eval-mode torch module."""
    import torch

    blob = torch.load(path, map_location="cpu", weights_only=True)
    name = blob.get("recipe") if isinstance(blob, dict) else None
    if not isinstance(name, str):  # never guessed: another recipe's weights would load into the wrong model
        from trainyard.errors import PermanentError

        raise PermanentError(
            f"{path}: not a model file of a built-in recipe (it names no 'recipe'); trainyard writes model.pt "
            f"as {{'recipe', 'config', 'state_dict'}}"
        )
    return get(name).model_from_blob(blob)


def check_spec(spec: JobSpec) -> None:
    """Cross-checks a JobSpec's recipe against the rest of it (options, built-in source, gate and champion
    metrics); raises SpecError naming every bad field."""
    from trainyard.errors import spec_error_message
    from trainyard.spec import SpecError

    problems = []
    if spec.recipe == "custom":  # the command brings its own model; its data uses the classification layout
        if spec.dataset.source not in ("sklearn_digits", "none"):
            problems.append(
                f"dataset.source: recipe 'custom' reads image-classification data; use "
                f"'sklearn_digits' or 'none', not {spec.dataset.source!r}"
            )
        if spec.recipe_options:
            problems.append("recipe_options: recipe 'custom' takes none (pass settings in custom.command)")
        if spec.champion:
            # the champion is re-measured on this run's data with the recipe's own metrics; a custom
            # program's model has no recipe to re-measure it with, so such a rule could never be honoured
            problems.append(
                "champion: recipe 'custom' cannot have champion rules (the platform cannot "
                "re-measure a custom model on this run's data); use gates, or a built-in recipe"
            )
        if problems:
            raise SpecError(spec_error_message(problems))
        return
    recipe = get(spec.recipe)
    problems += recipe.option_problems(spec.recipe_options)
    source = spec.dataset.source
    if source != "none" and source not in recipe.sources:
        problems.append(
            f"dataset.source: {source!r} does not fit recipe {spec.recipe!r}; "
            f"use one of {sorted(recipe.sources) + ['none']}"
        )
    known = {f"{split}_{m}" for split in ("val", "test") for m in recipe.metrics}
    for where, metrics in (("gates", [g.metric for g in spec.gates]), ("champion", [r.metric for r in spec.champion])):
        for i, metric in enumerate(metrics):
            if metric not in known:
                problems.append(
                    f"{where}[{i}].metric: recipe {spec.recipe!r} reports no {metric!r}; "
                    f"it reports {sorted(f'val_{m}' for m in recipe.metrics)} (test_* with a test split)"
                )
    if problems:
        raise SpecError(spec_error_message(problems))
