"""Where the nodes of a multi-node job meet: node 0 serves torchrun's c10d rendezvous at its host's address
and says so in the ledger; every other node looks for it there (:func:`node_place`). The nodes run on hosts
of their own, each a worker of the job's GPU type, each task's node given by its map index."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

from trainyard.scheduling.admission.ledger import Ledger, NotAdmitted
from trainyard.scheduling.hosts import host_address
from trainyard.spec import safe_key
from trainyard.training.launchers.command import NodePlace

if TYPE_CHECKING:
    from trainyard.scheduling.admission.lease import Lease
    from trainyard.scheduling.admission.policy import Job

ENDPOINT_POLL_S = 1.0  # a node looks this often for node 0's rendezvous endpoint
ENDPOINT_WAIT_S = 60.0  # and this long before its task gives its worker back and looks again later


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def node_place(ledger: Ledger, job: Job, node: int, lease: Lease, wait_s: float = ENDPOINT_WAIT_S) -> NodePlace | None:
    """Node ``node``'s place among ``job``'s nodes; None for a job of one node. Node 0 takes a free port at
    this host's address and records it as the rendezvous endpoint (until its try ends: ``lease.leave_node``);
    another node waits up to ``wait_s`` for node 0's. NotAdmitted (its task waits rescheduled, holding no
    worker, and looks again) where node 0 has not said it by then, or where the job was preempted or lost
    its admission meanwhile."""
    if job.nodes == 1:
        return None
    address, interface = host_address()
    rdzv_id = safe_key(job.id)
    if node == 0:
        served = f"{address}:{_free_port(address)}"
        ledger.join_node(job.id, 0, served)
        return NodePlace(0, served, rdzv_id, address, interface)
    deadline = time.monotonic() + wait_s
    while (endpoint := ledger.endpoint(job.id)) is None or not _answers(endpoint):
        if lease.lost.is_set() or lease.preempted.is_set() or time.monotonic() > deadline:
            raise NotAdmitted(f"job {job.id}: node 0 has not said where its rendezvous is; node {node} looks again")
        time.sleep(ENDPOINT_POLL_S)
    return NodePlace(node, endpoint, rdzv_id, address, interface)


def _answers(endpoint: str) -> bool:
    """Whether something listens at ``endpoint``: the endpoint of a node 0 that died without leaving (its row
    stays until its admission goes) answers nothing, and is not joined."""
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False
