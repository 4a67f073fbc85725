"""DeepSpeed's worker environment for one node, CPU or GPU.

DeepSpeed workers are started by torchrun, locally as on Kubernetes (``deepspeed.init_distributed()``
reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment torchrun sets), so
every strategy but Horovod has one launcher, :func:`trainyard.training.launchers.command.torchrun_argv`.
DeepSpeed's own launcher (``deepspeed.launcher.runner``) is not used: it starts a runner and a per-node
launcher in front of the workers, each importing DeepSpeed (about 20 s of start-up apiece on 2 cores); it
has no restarts after a worker crash, where torchrun has ``--max_restarts``; and it drops
CUDA_VISIBLE_DEVICES whenever it is given a process count, so a job could land on GPUs it was not given.

What DeepSpeed adds to :func:`trainyard.training.launchers.base.worker_env` is ``DS_ACCELERATOR=cpu`` on a
machine without CUDA, so it does not probe for other accelerators.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from trainyard.training.launchers.base import this_host_cores, worker_env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def with_accelerator(env: dict[str, str], cuda: bool | None = None) -> dict[str, str]:
    """``env`` with ``DS_ACCELERATOR=cpu`` where there is no CUDA GPU (an explicit DS_ACCELERATOR in it
    wins); ``cuda`` defaults to this machine's."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return env if cuda else {"DS_ACCELERATOR": "cpu", **env}


def deepspeed_env(
    nproc: int, base: Mapping[str, str], *, cuda: bool | None = None, cores: int | None = None, slots: int = 0
) -> dict:
    """The workers' environment: :func:`worker_env` (threads per worker), :func:`with_accelerator`.
    ``cuda``/``cores`` default to this machine's."""
    return with_accelerator(
        worker_env(nproc, base, cores=this_host_cores() if cores is None else cores, slots=slots), cuda
    )
