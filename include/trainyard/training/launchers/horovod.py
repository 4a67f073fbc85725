"""Horovod launcher: ``horovodrun --gloo`` on one node, every worker running ``trainyard.training.entry``.

Horovod is built from source into the venv by ``scripts/build_horovod.sh`` (CPU: PyTorch + Gloo, no
MPI). ``horovodrun`` is taken from next to the running interpreter, so the Airflow worker and the
training processes use the same venv. Its workers inherit horovodrun's environment, so
``base.worker_env`` (OMP_NUM_THREADS, ...) applies to them unchanged; no Horovod-specific variables
are needed on CPU (a Gloo-only build has no other CPU operations to choose from).
"""

from __future__ import annotations

import sys
from pathlib import Path


def horovodrun_bin(python: str | None = None) -> str:
    """The ``horovodrun`` script installed next to ``python`` (default: this interpreter)."""
    return str(Path(python or sys.executable).parent / "horovodrun")


def horovodrun_argv(nproc: int, config_path: str, *, python: str | None = None) -> list[str]:
    """The horovodrun command for ``nproc`` local workers. A pure function: nothing reaches a shell."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    py = python or sys.executable
    return [
        horovodrun_bin(py),
        "-np",
        str(nproc),
        "-H",
        f"localhost:{nproc}",
        "--gloo",
        py,
        "-m",
        "trainyard.training.entry",
        "--config",
        config_path,
    ]
