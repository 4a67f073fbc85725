"""ONNX export with a parity check against onnxruntime; TorchScript as an option."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


class ParityError(AssertionError):
    pass


class ExportFailed(Exception):
    """The exported model disagrees with PyTorch beyond tolerance (outputs, decoding or metric)."""


@dataclass(frozen=True)
class Parity:
    passed: bool
    max_abs_diff: float
    max_rel_diff: float
    mismatched: int
    total: int
    rtol: float
    atol: float

    def to_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter's graph passes log every rewrite at INFO (hundreds of lines per model); a task log
    needs the verdict, not those."""
    loggers = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export(model, example, path: str | Path, *, input_names=("input",), output_names=("logits",),
           dynamic_shapes: dict | None = None) -> Path:
    """Export with the TorchDynamo exporter, then run onnx's checker.

    ``example`` is one tensor or a tuple of them (the forward's positional arguments). Default dynamic
    axes: the batch axis of a single input named ``x``; pass ``dynamic_shapes`` (forward argument name ->
    {axis: torch.export.Dim}) for anything else."""
    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    tmp = path.with_name(f".{path.name}.tmp")
    if dynamic_shapes is None:
        dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1, max=65536)}}
    with _quiet_exporter():
        torch.onnx.export(
            model,
            example if isinstance(example, tuple) else (example,),
            str(tmp),
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    onnx.checker.check_model(str(tmp), full_check=True)
    tmp.replace(path)
    return path


def onnx_session(path: str | Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_predict(path: str | Path, x: np.ndarray, batch: int = 512) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def check_parity(expected: np.ndarray, actual: np.ndarray, rtol: float = 1e-3, atol: float = 1e-5) -> Parity:
    """numpy.isclose semantics: |actual - expected| <= atol + rtol * |expected|, element-wise."""
    if expected.shape != actual.shape:
        raise ParityError(f"ONNX output shape {actual.shape} != PyTorch output shape {expected.shape}")
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    close = diff <= atol + rtol * np.abs(expected)
    rel = diff / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    return Parity(
        passed=bool(close.all()),
        max_abs_diff=float(diff.max(initial=0.0)),
        max_rel_diff=float(rel.max(initial=0.0)),
        mismatched=int((~close).sum()),
        total=int(close.size),
        rtol=rtol,
        atol=atol,
    )


def export_torchscript(model, example, path: str | Path) -> Path:
    """``torch.jit.trace`` the model on ``example`` (a tensor or a tuple of them) and save it.

    TorchScript is deprecated in torch 2.x in favour of torch.export, but is still what many C++ and
    mobile runtimes load; the caller checks the saved file against the eager model, like the ONNX one."""
    import warnings

    import torch

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        traced = torch.jit.trace(model, example if isinstance(example, tuple) else (example,), check_trace=False)
        torch.jit.save(traced, str(tmp))
    tmp.replace(path)
    return path


def torchscript_predict(path: str | Path, *inputs: np.ndarray) -> list[np.ndarray]:
    """Every output of a saved TorchScript module on numpy inputs."""
    import warnings

    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        module = torch.jit.load(str(path), map_location="cpu")
        out = module(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]
