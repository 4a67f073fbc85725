"""ONNX export with a parity check against onnxruntime."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


class ParityError(AssertionError):
    pass


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


def export(model, example, path: str | Path) -> Path:
    """Export with a dynamic batch axis (TorchDynamo exporter), then run onnx's checker."""
    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    tmp = path.with_name(f".{path.name}.tmp")
    batch = torch.export.Dim("batch", min=1, max=65536)
    torch.onnx.export(
        model,
        (example,),
        str(tmp),
        input_names=["input"],
        output_names=["logits"],
        dynamic_shapes={"x": {0: batch}},
        dynamo=True,
        external_data=False,
    )
    onnx.checker.check_model(str(tmp), full_check=True)
    tmp.replace(path)
    return path


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
