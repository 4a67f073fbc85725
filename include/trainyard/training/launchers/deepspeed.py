"""The deepspeed launcher command for one node, CPU or GPU.

How DeepSpeed 0.19.8's launcher (``deepspeed/launcher/runner.py``) starts N processes without GPUs:

* The resource pool of the local host is ``get_accelerator().device_count()`` slots. For the CPU
  accelerator (``DS_ACCELERATOR=cpu``, also what it falls back to when it finds no GPU) that is the number
  of NUMA nodes (1 on most machines), so ``--include localhost:0,1`` fails ("No slot '1' specified").
* ``--num_accelerators N`` (the same option as ``--num_gpus``) replaces each host's slots with
  ``range(N)`` whatever the device count, so it starts N local processes on CPU as well as on N GPUs. The
  per-process launcher (``deepspeed.launcher.launch``) sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE,
  MASTER_ADDR/PORT and appends ``--local_rank=N``, which ``trainyard.training.entry`` accepts.
* ``--bind_cores_to_rank`` is left out: it needs ``numactl`` and pins OMP_NUM_THREADS itself; the
  thread count comes from :func:`trainyard.training.launchers.base.worker_env` instead.
* The launcher's default port is a fixed 29500, so two runs on one Airflow worker would collide; a free
  port is picked unless one is given (torchrun's ``--standalone`` does the same).

The launcher is started as ``python -m deepspeed.launcher.runner``: that is all the ``deepspeed`` console
script does, and it keeps the interpreter (and so the virtualenv) explicit even where the script is not
next to ``sys.executable``.

The command and environment a run uses are decided by :func:`trainyard.training.launchers.command.local_command`,
which calls these two; production and tests go through it alike.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping

from trainyard.training.launchers.base import this_host_cores, worker_env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def deepspeed_argv(
    nproc: int,
    config_path: str,
    *,
    python: str | None = None,
    master_port: int | None = None,
    visible_devices: str | None = None,
) -> list[str]:
    """The deepspeed launcher command for ``nproc`` processes on this node. Nothing user-supplied reaches
    a shell; without ``master_port`` a free one is picked (the only thing here that is not pure).

    ``visible_devices``: the CUDA_VISIBLE_DEVICES this machine's scheduler (or a person) gave the job. The
    runner drops that variable whenever ``--num_accelerators`` or ``--num_nodes`` is passed and starts the
    workers on GPUs 0..N-1 instead, so then the first ``nproc`` of those devices are named with
    ``--include`` (which excludes both options)."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    port = free_port() if master_port is None else master_port
    if visible_devices:
        devices = [d.strip() for d in visible_devices.split(",") if d.strip()]
        if len(devices) < nproc or not all(d.isdigit() for d in devices):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={visible_devices!r} must list at least {nproc} GPU indices for "
                "resources.gpus_per_node (DeepSpeed's --include takes indices, not UUIDs)"
            )
        placement = [f"--include=localhost:{','.join(devices[:nproc])}"]
    else:
        placement = ["--num_nodes=1", f"--num_accelerators={nproc}"]
    return [
        python or sys.executable,
        "-u",
        "-m",
        "deepspeed.launcher.runner",
        *placement,
        f"--master_port={port}",
        "--module",
        "trainyard.training.entry",
        "--config",
        config_path,
    ]


def deepspeed_env(nproc: int, base: Mapping[str, str], *, cuda: bool | None = None, cores: int | None = None) -> dict:
    """The launcher's environment: :func:`worker_env` (threads per worker), plus ``DS_ACCELERATOR=cpu``
    when there is no CUDA GPU, so DeepSpeed does not probe for other accelerators (an explicit
    DS_ACCELERATOR in ``base`` wins). ``cuda``/``cores`` default to this machine's."""
    env = worker_env(nproc, base, cores=this_host_cores() if cores is None else cores)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
    return env
