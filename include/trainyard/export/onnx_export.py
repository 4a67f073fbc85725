"""ONNX export with a parity check against onnxruntime; TorchScript as an option.

The parity gate compares each output tensor against the scale of that tensor (its largest |value| in the
PyTorch reference), not element by element. Why: two correct fp32 implementations of one model (PyTorch's
kernels, onnxruntime's, AVX2 vs AVX-512 code paths) disagree by rounding that accumulates over the
model's *intermediate* magnitudes, so an element near zero in a tensor whose values reach 20 carries the
rounding of the 20s. numpy.isclose's ``rtol * |expected|`` gives that element almost no room: the old
element-wise gate (rtol=1e-3, atol=1e-5) rejected a faithful transformer export on AVX-512 CPUs (one
logit of 50,592 off by 2.96e-05) and passed it elsewhere. Measured by ``bench/export_parity.py`` on
trained models of the built-in recipes (20 trainings each): faithful exports differ by at most 5.9e-6
of an output's scale (the transformer; the CNNs 8.9e-7 at most), while one weight of the middle hidden
layer moved by 3% of that layer's RMS weight (of its 16 largest, the one the outputs show most:
``one_weight_perturbed``) moves an output by 3.0e-5 (digits) and more. Each recipe's
default rtol (``Recipe.export_rtol``) sits between its own two figures, as one value cannot for all.
The bound is linear in a model's fp32 noise, which grows with depth and width: a much larger model than
the built-in defaults may need a larger rtol (run the bench).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainyard.errors import PermanentError


class ParityError(AssertionError):
    pass


class ExportFailed(PermanentError):
    """The exported model disagrees with PyTorch beyond tolerance (outputs, decoding or metric).

    ``record`` holds the export's figures (parity per output, metrics) when the verdict computed them, so a
    caller can report how far off the export was, not only that it was."""

    def __init__(self, message: str, record: dict | None = None):
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class OutputParity:
    """One output tensor: ``scale`` is its largest |value| in the reference; ``scaled_diff`` is its
    largest |actual - expected| divided by that scale (the figure the gate bounds by rtol)."""

    scale: float
    max_abs_diff: float
    scaled_diff: float
    mismatched: int
    total: int

    @property
    def passed(self) -> bool:
        return self.mismatched == 0


@dataclass(frozen=True)
class Parity:
    passed: bool
    max_abs_diff: float
    max_scaled_diff: float  # the worst output's scaled_diff
    mismatched: int
    total: int
    rtol: float
    atol: float
    outputs: dict[str, OutputParity] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        """The names of the outputs that differ beyond tolerance, in output order."""
        return [name for name, o in self.outputs.items() if not o.passed]

    def problem(self, what: str = "ONNX") -> str | None:
        """One line naming every output that differs and by how much; None when all agree."""
        if self.passed:
            return None
        worst = ", ".join(
            f"{name} ({o.mismatched}/{o.total} values; max abs diff {o.max_abs_diff:.3g} = "
            f"{o.scaled_diff:.3g} x its scale {o.scale:.3g})"
            for name, o in self.outputs.items()
            if not o.passed
        )
        return (
            f"{self.mismatched}/{self.total} {what} outputs differ beyond rtol={self.rtol} x each output's "
            f"max |value| + atol={self.atol}: {worst}"
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        for name, o in self.outputs.items():
            out["outputs"][name]["passed"] = o.passed
        out["failed"] = self.failed
        return out


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter's graph passes log every rewrite at INFO (hundreds of lines per model); a task log
    needs the verdict, not those. Its op registry warns once per torchvision op that torchvision is not
    installed: expected (its wheels do not load with the pinned torch, and no recipe uses its ops), and
    written to stderr, where Airflow shows it as an ERROR line; that notice alone is dropped."""
    loggers = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [lg.level for lg in loggers]
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    registry.addFilter(_no_torchvision_notice)
    try:
        yield
    finally:
        registry.removeFilter(_no_torchvision_notice)
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _no_torchvision_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("torchvision is not installed")


def export(
    model,
    example,
    path: str | Path,
    *,
    input_names=("input",),
    output_names=("logits",),
    dynamic_shapes: dict | None = None,
) -> Path:
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


# The export gate's rtol where no recipe gives its own (Recipe.export_rtol): the translation recipe's,
# the largest of the built-in ones. bench/export_parity.py --runs 20: its faithful exports <= 5.9e-6 of
# scale (2026-12-01; 1.4e-6 on 2026-12-04's CPU), one moved weight >= 6.0e-5.
DEFAULT_RTOL = 2e-5


def onnx_session(path: str | Path):
    """An onnxruntime CPU session. Its threads follow OMP_NUM_THREADS when it is set, as torch's do
    (onnxruntime itself ignores the variable and starts a spinning thread per core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdecimal() and int(threads) > 0:
        options.intra_op_num_threads = int(threads)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_predict(path: str | Path, x: np.ndarray, batch: int = 512) -> np.ndarray:
    session = onnx_session(path)
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def check_parity(
    expected, actual, rtol: float | None = None, atol: float | None = None, names: Sequence[str] | None = None
) -> Parity:
    """Compare a model's outputs: ``expected`` and ``actual`` are one array or a list of arrays (one per
    output, named by ``names``). An element passes when ``|actual - expected| <= atol + rtol * scale``,
    where ``scale`` is the largest |value| of that output's reference tensor: numpy.isclose with the
    element's own magnitude replaced by its tensor's (see the module docstring for why). ``rtol``
    defaults to DEFAULT_RTOL (a recipe passes its own), ``atol`` to ExportSpec's."""
    rtol = DEFAULT_RTOL if rtol is None else rtol
    if atol is None:
        from trainyard.spec import ExportSpec

        atol = ExportSpec().atol
    expected = [expected] if isinstance(expected, np.ndarray) else list(expected)
    actual = [actual] if isinstance(actual, np.ndarray) else list(actual)
    names = (
        list(names)
        if names is not None
        else (["output"] if len(expected) == 1 else [f"output{i}" for i in range(len(expected))])
    )
    if not len(expected) == len(actual) == len(names):
        raise ParityError(f"{len(actual)} outputs to compare with {len(expected)} references named {names}")
    outputs = {}
    for name, e, a in zip(names, expected, actual, strict=True):
        e, a = np.asarray(e, dtype=np.float64), np.asarray(a, dtype=np.float64)
        if e.shape != a.shape:
            raise ParityError(f"ONNX output {name!r} shape {a.shape} != PyTorch output shape {e.shape}")
        # NaN anywhere makes the diff, the maximum and the scale NaN, and NaN <= bound is False: a NaN output fails
        diff = np.abs(a - e)
        scale = float(np.abs(e).max(initial=0.0))
        worst = float(diff.max(initial=0.0))
        scaled = worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))
        outputs[name] = OutputParity(
            scale=scale,
            max_abs_diff=worst,
            scaled_diff=scaled,
            mismatched=int((~(diff <= atol + rtol * scale)).sum()),
            total=int(e.size),
        )
    return Parity(
        passed=all(o.passed for o in outputs.values()),
        max_abs_diff=float(np.max([o.max_abs_diff for o in outputs.values()], initial=0.0)),
        max_scaled_diff=float(np.max([o.scaled_diff for o in outputs.values()], initial=0.0)),
        mismatched=sum(o.mismatched for o in outputs.values()),
        total=sum(o.total for o in outputs.values()),
        rtol=rtol,
        atol=atol,
        outputs=outputs,
    )


def output_tensors(out) -> list:
    """A model's outputs as a list: one tensor, a tuple or list of them, or a dict of them (its values)."""
    if isinstance(out, dict):
        return list(out.values())
    return list(out) if isinstance(out, (tuple, list)) else [out]


def one_weight_perturbed(model, fraction: float, example, candidates: int = 16):
    """A copy of ``model`` with ONE weight changed by ``fraction`` of its layer's RMS weight, in the middle
    hidden weight layer (matrices and kernels, neither the first nor the last). The corruption the parity
    gate must catch: a mis-converted op or a bad byte in a weight file changes a few numbers, not all of them.

    The weight is the one of the layer's ``candidates`` largest (by |w|) whose change moves the model's
    outputs on ``example`` (a tensor or a tuple of them, as ``export`` takes) the most, relative to each
    output's scale: a weight feeding a channel that a ReLU zeroes for these inputs changes nothing that any
    comparison of outputs could see (in a small ResNet the largest weight is such one about a run in ten).
    Returns (model copy, parameter name, flat index)."""
    import copy

    import torch

    if candidates < 1:
        raise ValueError(f"candidates must be 1 or more, not {candidates}")
    bad = copy.deepcopy(model).eval()
    layers = [(n, p) for n, p in bad.named_parameters() if p.ndim >= 2]
    if len(layers) < 3:
        raise ValueError(f"{type(model).__name__} has {len(layers)} weight layers; a hidden one needs 3 or more")
    name, weight = layers[1:-1][(len(layers) - 2) // 2]
    args = example if isinstance(example, tuple) else (example,)

    def outputs() -> list:
        return [t.detach().float() for t in output_tensors(bad(*args))]

    with torch.no_grad():
        flat = weight.view(-1)
        step = fraction * float(flat.pow(2).mean().sqrt())
        before = outputs()
        moved: dict[int, float] = {}
        for index in flat.abs().topk(min(candidates, flat.numel())).indices.tolist():
            kept = flat[index].clone()  # restored exactly: (w + step) - step is not always w in floating point
            flat[index] = kept + step
            after = outputs()
            flat[index] = kept
            moved[index] = max(
                float((a - b).abs().max()) / max(float(b.abs().max()), 1e-12)
                for a, b in zip(after, before, strict=True)
            )
        index = max(moved, key=moved.__getitem__)
        if moved[index] == 0:
            raise ValueError(
                f"none of the {len(moved)} largest weights of {name} changes {type(model).__name__}'s outputs on "
                "this example: the layer is dead for it; give an example that reaches it"
            )
        flat[index] += step
    return bad, name, index


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
    return [o.numpy() for o in output_tensors(out)]
