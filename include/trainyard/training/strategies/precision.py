"""``distributed.precision`` in the worker: which combinations can train, and the autocast / grad-scaler
pieces the torch strategies (ddp, horovod) use. DeepSpeed turns the same field into its own bf16 / fp16
config blocks (:mod:`trainyard.training.deepspeed_config`).

* ``fp32``: nothing.
* ``bf16``: the model stays fp32 and its forward runs under ``torch.autocast`` (CPU and CUDA). bf16 keeps
  fp32's exponent range, so no loss scaling is needed.
* ``fp16``: autocast plus ``torch.amp.GradScaler`` against gradient underflow. CUDA only: there is no fp16
  training on CPU workers (DeepSpeed's CPU accelerator refuses it too).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError
from trainyard.spec import JobSpec

if TYPE_CHECKING:
    import torch

ON_CPU = ("fp32", "bf16")


class PrecisionError(PermanentError, ValueError):
    """``distributed.precision`` asks for something the workers cannot do."""


def check_precision(spec: JobSpec, cuda: bool) -> None:
    """Raise PrecisionError when ``spec.distributed.precision`` cannot train on the workers (``cuda``:
    whether they train on CUDA GPUs). Pure: the validate step calls it before any process starts, and
    every worker calls it again with what it found."""
    precision = spec.distributed.precision
    if precision == "fp16" and not cuda:
        raise PrecisionError(
            f"distributed.precision 'fp16' needs CUDA GPUs (strategy {spec.distributed.strategy!r}: fp16 "
            f"training needs a CUDA gradient scaler; DeepSpeed's CPU accelerator has no fp16); "
            f"allowed on CPU workers: {' or '.join(repr(p) for p in ON_CPU)}"
        )


def autocast_dtype(precision: str) -> torch.dtype | None:
    import torch  # not at module level: the validate step calls check_precision without torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(precision: str, device: torch.device):
    """The context the forward pass and loss run in."""
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    import torch

    return torch.amp.GradScaler(device.type) if precision == "fp16" else None
