"""What the built-in recipes share: the worker half of a classifier, reading a prepared split, the export
verdict (parity, the metric through onnxruntime, TorchScript) and the registered input example. The
interface itself is :class:`trainyard.recipes.base.Recipe`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from trainyard.recipes.base import OptionsT, Recipe
from trainyard.spec import ExportSpec
from trainyard.training.common import evaluate, to_device

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData


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
        acc, loss = evaluate(model, (to_device(b, device, dtype) for b in val.batches(self.val_batch)))
        return {"val_accuracy": acc, "val_loss": loss}


def read_split(data: PreparedData, split: str):
    """(keys, labels, arrays, meta, targets) of a prepared split."""
    from trainyard.data import formats

    return formats.read_with_targets(data.format, data.split(split))


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
