"""The launcher seam: plan -> launch -> collect, with a local and a Kubernetes implementation.

- **plan**: what will run, decided from the JobSpec, the prepared data and the run's paths alone (argv and
  environment locally, :mod:`~trainyard.training.launchers.command`; the Job/Service or Pod objects on
  Kubernetes, :mod:`~trainyard.training.launchers.kubernetes`).
- **launch**: start the workers and wait for them. Locally a subprocess of the task
  (:func:`trainyard.training.launchers.local.launch`); on Kubernetes the Airflow operator
  (``trainyard_airflow.operators.launch``) creates the objects through the provider's hook and waits
  deferred, in the triggerer, so the library holds no Kubernetes connection and no waiting loop.
- **collect**: this try's usage record, from when its workers really ran (a subprocess's lifetime; the
  pods' container start and finish times, never their time in a queue). Always written, after a failure
  or an interrupt too, so ``run_cost`` also counts the GPU time of the tries that failed.

Both implementations share this contract (``tests/unit/training/test_launcher_contract.py``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trainyard.errors import PermanentError
from trainyard.spec import JobSpec
from trainyard.training import usage

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData


@dataclass(frozen=True)
class Interval:
    """When a try's workers held their GPUs, in epoch seconds."""

    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def next_attempt(run_dir: str | Path) -> int:
    """The number of this try: one more than the tries already recorded for the run."""
    return len(usage.tries(run_dir)) + 1


class Launcher(ABC):
    """One way of running a JobSpec's workers. ``where`` names it in the usage records."""

    where: ClassVar[str]

    @abstractmethod
    def plan(self, spec: JobSpec, data: PreparedData, *, run_dir: str, config_path: str) -> Any:
        """What will run. No side effect but idempotent files the workers read."""

    @abstractmethod
    def collect(self, plan: Any, observed: Any) -> Interval | None:
        """When this try's workers ran, from what the launch observed; None if they never started."""

    def record(self, spec: JobSpec, run_dir: str | Path, interval: Interval | None, node: int | None = None) -> int:
        """Append this try's usage record (a try whose workers never started held no GPU: nothing to add):
        all of the job's GPUs, or with ``node``, that node's, launched on its own."""
        attempt = next_attempt(run_dir)
        if interval is not None:
            usage.record_try(
                run_dir,
                attempt=attempt,
                started=interval.started,
                ended=interval.ended,
                gpus=spec.resources.total_gpus if node is None else spec.resources.gpus_per_node,
                where=self.where,
                node=node or 0,
            )
        return attempt


def worker_env(
    nproc_per_node: int, base: Mapping[str, str] | None = None, *, cores: int | None = None, slots: int = 0
) -> dict[str, str]:
    """The environment every built-in strategy's workers share on one node (``base`` is not modified;
    ``base``/``cores`` default to this process's environment and this machine's cores). ``slots``: the
    worker processes this node runs at once over all jobs (its pool's slots here), 0 if only this job's."""
    env = dict(os.environ if base is None else base)
    cores = this_host_cores() if cores is None else cores
    # Each worker computes on its slot's share of the cores. With a thread per core, the workers of this
    # job and of the jobs beside it spin-wait for cores the others hold: two 1-process digits jobs on 2
    # cores trained at 97 samples/s each, against ~800 with one thread each (2026-12-01). The `cpu` pool's
    # size is taken as this host's number of CPU slots (one worker host, as with LocalExecutor).
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(nproc_per_node, slots))))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torchrun's workers otherwise share the agent's rendezvous TCPStore across restarts, and a restarted
    # group can read the dead workers' gloo addresses from it ("Connection refused", or a hang). A store
    # per restart round makes --max-restarts work (tests/integration/test_resume.py kills a worker).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


# How far apart the nodes of one job may start (image pulls, scheduling, a node task queued behind another).
RDZV_TIMEOUT_S = 900
# Elastic (min_nodes < nodes): once min_nodes are at a rendezvous, how long it waits for the rest. The nodes
# left go on this long after torchrun's keep-alive has given a lost node up (3 missed beats 5 s apart); at the
# start, a node later than this joins once it comes (its nodes start again, from where they are, with it).
ELASTIC_LAST_CALL_S = 5


def rendezvous_args(spec: JobSpec, endpoint: str, rdzv_id: str, is_host: bool | None = None) -> list[str]:
    """torchrun's options for one node of ``spec``'s nodes: c10d's rendezvous in a store that node 0 serves at
    ``endpoint`` (``host:port``), the round named ``rdzv_id``; ``is_host``: whether this node serves the store
    (None: torch decides, by whether ``endpoint`` names this machine). The same on Kubernetes and locally."""
    res = spec.resources
    conf = f"join_timeout={RDZV_TIMEOUT_S},read_timeout={RDZV_TIMEOUT_S}"
    if res.elastic:  # past min_nodes, a round waits this long for the others, then goes on without them
        conf += f",last_call_timeout={ELASTIC_LAST_CALL_S}"
    if is_host is not None:
        conf += f",is_host={str(is_host).lower()}"
    return [
        f"--nnodes={res.min_nodes}:{res.nodes}" if res.elastic else f"--nnodes={res.nodes}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={rdzv_id}",
        f"--rdzv_conf={conf}",
    ]


def this_host_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or a `taskset`'s share, not the
    whole machine's count)."""
    return len(os.sched_getaffinity(0)) or 1


class MaxHoursReached(PermanentError):
    """The run's training reached ``resources.max_hours``: retrying cannot help."""


def time_left(spec: JobSpec, run_dir: str | Path) -> float:
    """Seconds of ``resources.max_hours`` the run's earlier tries left; MaxHoursReached if none."""
    left = usage.seconds_left(run_dir, spec.resources.max_hours)
    if left <= 0:
        raise MaxHoursReached(
            f"resources.max_hours: the run's tries have used all {spec.resources.max_hours:g} hour(s); "
            f"raise it to train longer"
        )
    return left
