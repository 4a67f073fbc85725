"""``trainyard worker``: a GPU host's Celery worker, serving only the GPU types its host has.

It reads the host's inventory (``TRAINYARD_GPU_DEVICES``, typed: :mod:`trainyard.scheduling.hosts`), starts
``airflow celery worker`` on those types' queues (``<[trainyard] training_queue>-<type>``, where the
cluster policy sends each type's trainings), and while that runs announces the host's types and devices
in the admission ledger every :data:`~.admission.ledger.HOST_BEAT_S` (:meth:`~.admission.ledger.Ledger.announce`):
a job of a type no live worker serves waits, saying so, instead of being admitted to a queue nobody reads.
When the Celery worker ends, the host retires at once; killed with it, its announcement lapses within
:data:`~.admission.ledger.HOST_LEASE_S`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError, cli_command
from trainyard.scheduling.admission.ledger import HOST_BEAT_S, HOST_LEASE_S
from trainyard.scheduling.cluster import CPU_TYPE
from trainyard.scheduling.hosts import DEVICES_ENV, HOST_ENV, Inventory, routing_prefix, training_queue_of
from trainyard.scheduling.ledger_db import DatabaseUnavailable

if TYPE_CHECKING:
    from trainyard.scheduling.admission.ledger import Ledger
    from trainyard.scheduling.resources import ResourcesConfig

log = logging.getLogger(__name__)
STOP_POLL_S = 0.2  # how soon a stop retires the host (and the worker's end is seen)


def worker_queues(prefix: str, inventory: Inventory, config: ResourcesConfig, extra: Sequence[str] = ()) -> list[str]:
    """The queues of the GPU types ``inventory`` lists, and ``extra`` ones; PermanentError for an untyped
    inventory, a type the fleet (resources.yaml) does not have (a typo would serve nothing, and say
    nothing), or an extra queue that is another type's training queue (its trainings would fail here)."""
    if inventory.by_type is None:
        raise PermanentError(
            f"trainyard worker serves the GPU types its host lists: set {DEVICES_ENV} to "
            "'<type>=<devices>;...', e.g. 'h100-80gb=0,1,2,3;cpu=' (the cpu type bare)"
        )
    unknown = sorted(set(inventory.by_type) - set(config.slot_types))
    if unknown:
        raise PermanentError(
            f"{DEVICES_ENV} lists GPU type(s) {unknown} that resources.yaml does not have (it lists "
            f"{sorted(config.slot_types)}, a MIG type by its profiles): correct the name, or add the type to the fleet"
        )
    if not inventory.by_type:
        raise PermanentError(f"{DEVICES_ENV} lists no GPU type: this worker would serve nothing")
    own = [training_queue_of(prefix, t) for t in inventory.by_type]
    others = [q for q in extra if q.startswith(f"{prefix}-") and q not in own]
    if others:
        raise PermanentError(
            f"--queue {others}: another GPU type's training queue; list the type and its devices in {DEVICES_ENV}"
        )
    return [*own, *(q for q in extra if q not in own)]


def default_concurrency(inventory: Inventory, config: ResourcesConfig) -> int:
    """Trainings at once on a host: one per device it lists, and the ``cpu`` type's slots where it lists
    that type (the ledger admits that many; fewer would leave admitted jobs in the broker)."""
    by_type = inventory.by_type or {}
    cpu = config.gpu_types[CPU_TYPE].count if CPU_TYPE in by_type and CPU_TYPE in config.gpu_types else 0
    return max(1, sum(len(devices) for devices in by_type.values()) + cpu)


def _die_with_parent() -> Callable[[], None]:
    """What the Celery worker's process runs before it execs: ask Linux for SIGTERM when ``trainyard worker``
    dies (a SIGKILL, an OOM kill), as its host's announcement lapses, instead of serving on unannounced;
    where the parent is gone already, end at once. libc's prctl is found here, in the parent: the child
    only calls it."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def in_child() -> None:
        if prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(1)

    return in_child


def serve(ledger: Ledger, inventory: Inventory, argv: Sequence[str], beat_s: float = HOST_BEAT_S) -> int:
    """Run ``argv`` (the Celery worker) and announce ``inventory`` for ``ledger.host`` every ``beat_s`` while
    it runs. SIGTERM or SIGINT retires the host at once (no job is admitted for it while it drains) and is
    passed on as SIGTERM: Celery's warm shutdown, its running trainings finish (a SIGINT would cancel them);
    a second one is passed on as SIGQUIT, Celery's cold shutdown. The worker runs in a session of its own (a
    terminal's Ctrl-C reaches it through here only) and dies with this process. Its exit status is
    returned, the host retired. A ledger that cannot be reached for a while is logged, and the worker runs
    on: the host's jobs wait, saying the type is not served, until it is reached again."""
    by_type = inventory.by_type or {}
    stop: list[int] = []  # the signals that asked for the end
    child: subprocess.Popen | None = None

    def pass_on(signum: int, _frame: object) -> None:
        stop.append(signum)
        if child is not None:
            child.send_signal(signal.SIGTERM if len(stop) == 1 else signal.SIGQUIT)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        child = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent()
        )
        if stop:  # asked to stop before the worker was there to hear it
            child.send_signal(signal.SIGTERM)
        retired, announced = False, 0.0
        while child.poll() is None:
            if stop and not retired:
                retired = _retire(ledger, by_type)
            elif not stop and time.monotonic() - announced >= beat_s:
                announced = time.monotonic()
                try:
                    ledger.announce(by_type, lease_s=max(HOST_LEASE_S, 4 * beat_s))
                except DatabaseUnavailable as err:
                    log.warning("host %s not announced (its types' jobs wait until it is): %s", ledger.host, err)
            time.sleep(STOP_POLL_S)
        return child.returncode
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
        _retire(ledger, by_type)


def _retire(ledger: Ledger, by_type: Mapping[str, Sequence[str]]) -> bool:
    """The host's types served no more; False (logged) where the ledger cannot be reached now."""
    try:
        ledger.retire(by_type)
    except DatabaseUnavailable as err:
        log.warning("host %s not retired (its announcement lapses by itself): %s", ledger.host, err)
        return False
    return True


def celery_args(remainder: list[str]) -> list[str]:
    """What follows ``--`` on the command line (argparse keeps the ``--`` in a REMAINDER)."""
    return remainder[1:] if remainder[:1] == ["--"] else remainder


def cmd_worker(args: argparse.Namespace) -> int:
    from trainyard.scheduling.admission.ledger import default_ledger
    from trainyard.scheduling.hosts import host_inventory, host_name

    prefix = routing_prefix()
    if prefix is None:
        raise PermanentError(
            "trainings are not routed by GPU type here ([trainyard] training_queue is unset; with LocalExecutor "
            "every task runs on this host): set it (the cluster profile sets 'gpu') to run type workers"
        )
    if args.name:
        os.environ[HOST_ENV] = args.name  # the tasks it runs claim devices as this host (Ledger.host)
    name = host_name()
    ledger = default_ledger()
    inventory = host_inventory()
    queues = worker_queues(prefix, inventory, ledger.config, args.queues)
    concurrency = args.concurrency or default_concurrency(inventory, ledger.config)
    argv = ["airflow", "celery", "worker", "--queues", ",".join(queues), "--concurrency", str(concurrency),
            "--celery-hostname", f"{name}@%h", *celery_args(args.celery_args)]  # fmt: skip
    log.info("host %s serves %s on queues %s", name, inventory.by_type, queues)
    return serve(ledger, inventory, argv)


def add_worker_parser(sub) -> None:
    p = sub.add_parser(
        "worker",
        help=f"a GPU host's Celery worker, serving the GPU types {DEVICES_ENV} lists (routed by type)",
        description=(
            f"Start `airflow celery worker` on the training queues of the GPU types {DEVICES_ENV} lists "
            "('<type>=<devices>;...'), and announce them in the admission ledger while it runs: a job of a "
            "type no live worker serves waits, saying so. Arguments after '--' go to the Celery worker."
        ),
    )
    p.add_argument("--name", help=f"this host's name in the ledger (default: ${HOST_ENV}, else the hostname)")
    p.add_argument(
        "--concurrency", type=int, help="trainings at once (default: one per device listed, and the cpu type's slots)"
    )
    p.add_argument(
        "--queue", dest="queues", action="append", default=[], help="another queue to serve too (repeatable)"
    )
    p.add_argument("celery_args", nargs=argparse.REMAINDER, help="after '--': more arguments for the Celery worker")
    p.set_defaults(func=cli_command(cmd_worker))
