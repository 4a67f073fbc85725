"""Local launcher: torchrun as a subprocess of the Airflow task, its output streamed line by line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque
from typing import Callable


class LaunchError(RuntimeError):
    pass


def torchrun_argv(nproc_per_node: int, config_path: str, *, max_restarts: int = 0, python: str | None = None) -> list[str]:
    """The torchrun command for one node. A pure function: nothing user-supplied reaches a shell."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={nproc_per_node}",
        f"--max_restarts={max_restarts}",
        "-m",
        "trainyard.training.entry",
        "--config",
        config_path,
    ]


def command_for(spec: dict, config_path: str) -> list[str]:
    """The local launch command for a JobSpec: the strategy picks the launcher."""
    strategy = spec.get("distributed", {}).get("strategy", "ddp")
    nproc = spec["resources"]["gpus_per_node"]
    if strategy == "ddp":
        return torchrun_argv(nproc, config_path, max_restarts=spec["distributed"]["max_restarts"])
    if strategy == "horovod":
        from trainyard.training.launchers.horovod import horovodrun_argv

        return horovodrun_argv(nproc, config_path)
    if strategy == "deepspeed":
        from trainyard.training.launchers.deepspeed import deepspeed_argv

        return deepspeed_argv(nproc, config_path)
    raise ValueError(f"unknown distributed.strategy {strategy!r}; allowed: ddp, horovod, deepspeed")


def worker_env(nproc_per_node: int, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    # Without this each worker starts one thread per core and N workers fight over 2 cores.
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // nproc_per_node)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torchrun's workers otherwise share the agent's rendezvous TCPStore across restarts, and a restarted
    # group can read the dead workers' gloo addresses from it ("Connection refused", or a hang). A store
    # per restart round makes --max-restarts work (tests/integration/test_resume.py kills a worker).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def run(argv: list[str], *, env: dict | None = None, on_line: Callable[[str], None] = print, tail: int = 40) -> None:
    """Run ``argv``, pass every output line to ``on_line``, raise LaunchError with the last lines on failure.

    The child gets its own process group, which is killed if this call is interrupted (task timeout,
    "mark failed"), so no orphaned workers keep the GPUs."""
    last: deque[str] = deque(maxlen=tail)
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            last.append(line)
            on_line(line)
        rc = proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    if rc != 0:
        raise LaunchError(f"{' '.join(argv[:3])} exited with {rc}; last lines:\n" + "\n".join(last))

