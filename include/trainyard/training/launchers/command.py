"""The one place a strategy becomes a local command: ``local_command(spec, host, ...) -> Command``.

A pure function of the JobSpec and the facts of the machine (:class:`Host`, read once by the caller), so
production (:func:`trainyard.training.launchers.local.launch`) and the tests build exactly the same argv
and environment. Nothing user-supplied goes through a shell: every argument is one argv item.

- ddp: ``torchrun --standalone`` with ``gpus_per_node`` processes; one node of several (``resources.nodes``
  > 1, :class:`NodePlace`): torchrun with c10d's rendezvous in the store node 0 serves, as on Kubernetes
  (:func:`~trainyard.training.launchers.base.rendezvous_args`), reached at this host's own address;
- horovod: ``horovodrun --gloo`` (:mod:`~trainyard.training.launchers.horovod`);
- deepspeed: torchrun as for ddp, with ``DS_ACCELERATOR=cpu`` on a machine without CUDA
  (:mod:`~trainyard.training.launchers.deepspeed` says why not DeepSpeed's own launcher);
- custom: the user's command under ``torchrun --no-python``, with the platform environment of
  :func:`trainyard.training.custom.platform_env` (the same four variables the pods get) and nothing of
  the task's but :func:`~trainyard.training.launchers.sandbox.scrubbed_env`.

The built-in strategies' workers keep a little more of the task's environment (``scrubbed_env(...,
built_in=True)``: trainyard's home, the libraries' tuning variables), never its secrets. The local launcher
runs every kind in the :mod:`~trainyard.training.launchers.sandbox` where the host has one.

On a machine with CUDA each process takes one GPU (``cuda:<local_rank>``), so ``gpus_per_node`` may not
exceed the GPUs present; without CUDA the processes are CPU workers and any count runs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainyard.errors import PermanentError
from trainyard.spec import JobSpec
from trainyard.training import custom
from trainyard.training.launchers.base import rendezvous_args, worker_env
from trainyard.training.launchers.deepspeed import with_accelerator
from trainyard.training.launchers.horovod import horovodrun_argv
from trainyard.training.launchers.sandbox import scrubbed_env


@dataclass(frozen=True)
class Host:
    """What a local command depends on besides the spec."""

    cuda_devices: int  # 0: no CUDA, the workers run on CPU
    cores: int
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = sys.executable
    cpu_slots: int = 0  # CPU worker processes this host runs at once over all jobs (the `cpu` pool's slots)

    def workers_at_once(self, spec: JobSpec) -> int:
        """The worker processes of ``spec``'s pool that share this host's cores when the pool is full: one per
        CPU slot for a ``cpu`` job, one per GPU otherwise (0: unknown)."""
        return self.cpu_slots if spec.resources.gpu_type == "cpu" else self.cuda_devices


@dataclass(frozen=True)
class NodePlace:
    """One node of a multi-node job, on a host of its own: its index (0 serves the rendezvous store), node 0's
    rendezvous ``endpoint`` (``address:port``), the round's ``rdzv_id``, and this host's ``address`` and its
    network ``interface``, where the other nodes reach it (torchrun advertises the address, gloo and NCCL
    bind the interface: a host's name may resolve to an address of another network)."""

    index: int
    endpoint: str
    rdzv_id: str
    address: str
    interface: str


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]


def check_gpus(spec: JobSpec, cuda_devices: int) -> None:
    """Refuse a GPU count this machine does not have (a worker on a missing ``cuda:N`` fails late and
    obscurely); CPU-only machines run CPU workers and take any count."""
    want = spec.resources.gpus_per_node
    if cuda_devices and want > cuda_devices:
        raise PermanentError(
            f"resources.gpus_per_node is {want} but this machine has {cuda_devices} CUDA GPU(s): "
            f"set resources.gpus_per_node to at most {cuda_devices} for the local launcher, or use "
            "backends.launcher 'kubernetes'"
        )


def torchrun_argv(
    nproc_per_node: int,
    config_path: str,
    *,
    max_restarts: int = 0,
    python: str | None = None,
    program: tuple[str, ...] | None = None,
    rendezvous: list[str] | None = None,
    address: str = "127.0.0.1",
) -> list[str]:
    """The torchrun command for one node: the trainyard worker for ``config_path``, or, with ``program``,
    that argv run as given (``--no-python``: not as a Python script), as a custom command is. ``rendezvous``:
    a multi-node job's options (:func:`~trainyard.training.launchers.base.rendezvous_args`), else the node is
    the job's only one; ``address``: where this node is reached."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    worker = ["--no-python", *program] if program else ["-m", "trainyard.training.entry", "--config", config_path]
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        *(rendezvous if rendezvous is not None else ["--standalone", "--nnodes=1"]),
        f"--nproc_per_node={nproc_per_node}",
        f"--max_restarts={max_restarts}",
        # One node alone runs in the sandbox's network namespace, where loopback is the only interface: its
        # workers must find the rendezvous there, not at the address this host's name resolves to. A node of
        # several is reached at its host's address.
        f"--local-addr={address}",
        *worker,
    ]


def custom_argv(spec: JobSpec, python: str | None = None) -> list[str]:
    """The user's command as torchrun's worker program."""
    if spec.custom is None:
        raise PermanentError("recipe 'custom' needs the custom section (command, optional image)")
    return torchrun_argv(
        spec.resources.gpus_per_node,
        "",
        max_restarts=spec.distributed.max_restarts,
        python=python,
        program=spec.custom.command,
    )


def _among_nodes(spec: JobSpec, node: NodePlace | None) -> tuple[list[str] | None, str, dict[str, str]]:
    """A node's torchrun rendezvous options, its address, and the environment that binds its workers'
    collectives to its interface; nothing for a job of one node (what runs on several: the JobSpec's rule).
    PermanentError for a node without its place."""
    nodes = spec.resources.nodes
    if nodes == 1:
        return None, "127.0.0.1", {}
    if node is None:
        raise PermanentError(f"resources.nodes is {nodes}: each node needs its place (NodePlace), none was given")
    rendezvous = rendezvous_args(spec, node.endpoint, node.rdzv_id, is_host=node.index == 0)
    return rendezvous, node.address, {"GLOO_SOCKET_IFNAME": node.interface, "NCCL_SOCKET_IFNAME": node.interface}


def local_command(
    spec: JobSpec,
    host: Host,
    *,
    config_path: str,
    data_dir: str,
    run_dir: str,
    trial: bool = False,
    node: NodePlace | None = None,
) -> Command:
    """Argv and environment of one node's workers for ``spec`` on ``host``; ``trial``: a sweep trial's;
    ``node``: where this node stands among a multi-node job's."""
    check_gpus(spec, host.cuda_devices)
    nproc = spec.resources.gpus_per_node
    built_in = spec.recipe != "custom"
    rendezvous, address, interface = _among_nodes(spec, node)
    # a built-in trainer keeps its settings, none of the task's secrets; a custom program not even those
    kept = scrubbed_env(host.env, built_in=built_in)
    env = {**worker_env(nproc, kept, cores=host.cores, slots=host.workers_at_once(spec)), **interface}
    if not built_in:
        hyperparameters = spec.hyperparameters.model_dump(mode="json")
        platform = custom.platform_env(data_dir, run_dir, hyperparameters, trial=trial)
        return Command(custom_argv(spec, host.python), {**env, **platform})
    strategy = spec.distributed.strategy
    if strategy in ("ddp", "deepspeed"):
        argv = torchrun_argv(
            nproc,
            config_path,
            max_restarts=spec.distributed.max_restarts,
            python=host.python,
            rendezvous=rendezvous,
            address=address,
        )
        if strategy == "deepspeed":
            env = with_accelerator(env, cuda=host.cuda_devices > 0)
    elif strategy == "horovod":
        argv = horovodrun_argv(nproc, config_path, python=host.python)
    else:  # the spec's Literal makes this unreachable unless a strategy is added without a launcher
        raise PermanentError(
            f"distributed.strategy {strategy!r} has no local launcher; allowed: ddp, horovod, deepspeed"
        )
    return Command(argv, env)
