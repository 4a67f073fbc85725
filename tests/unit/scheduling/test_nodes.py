"""Where the nodes of a multi-node job meet (trainyard.scheduling.nodes), and the address a host is reached at
(trainyard.scheduling.hosts.host_address)."""

import socket
import threading

import psutil
import pytest

from trainyard.errors import PermanentError
from trainyard.scheduling import nodes
from trainyard.scheduling.admission.lease import JobGone, Lease, follow
from trainyard.scheduling.admission.ledger import Ledger, NotAdmitted
from trainyard.scheduling.admission.policy import Job
from trainyard.scheduling.hosts import ADDRESS_ENV, host_address
from trainyard.scheduling.resources import parse_resources

FLEET = "gpu_types:\n  cpu: {count: 2, price_per_hour: 0.0}\nteams:\n  vision: {quota: {cpu: 2}}\n"
PAIR = Job("train/run-1", "vision", "cpu", 2, 1, 1.0, nodes=2)


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "host_address", lambda: ("127.0.0.1", "lo"))
    return Ledger(tmp_path / "admission.db", parse_resources(FLEET), host="gpu-a")


def _lease() -> Lease:
    return Lease(None, threading.Event())


def test_node_0_serves_the_rendezvous_at_its_address_and_the_other_node_finds_it(ledger):
    assert nodes.node_place(ledger, Job("one", "vision", "cpu", 1, 1, 1.0), 0, _lease()) is None  # one node
    assert ledger.request(PAIR).admitted
    first = nodes.node_place(ledger, PAIR, 0, _lease())
    address, port = first.endpoint.rsplit(":", 1)
    assert (first.index, address, first.address, first.interface) == (0, "127.0.0.1", "127.0.0.1", "lo")
    assert int(port) > 0 and first.rdzv_id == "train_run-1"
    with pytest.raises(NotAdmitted):  # nothing listens there yet (node 0's torchrun starts after this)
        nodes.node_place(ledger, PAIR, 1, _lease(), wait_s=0.05)
    with socket.create_server((address, int(port))):  # node 0's store, up
        second = nodes.node_place(ledger, PAIR, 1, _lease())
    assert (second.index, second.endpoint, second.rdzv_id) == (1, first.endpoint, first.rdzv_id)


def test_a_node_that_finds_no_endpoint_gives_its_worker_back_and_looks_again_later(ledger, monkeypatch):
    monkeypatch.setattr(nodes, "ENDPOINT_POLL_S", 0.01)
    assert ledger.request(PAIR).admitted
    with pytest.raises(NotAdmitted, match="node 0 has not said where its rendezvous is"):
        nodes.node_place(ledger, PAIR, 1, _lease(), wait_s=0.05)
    preempted = _lease()
    preempted.preempted.set()
    ledger.join_node(PAIR.id, 0, "127.0.0.1:1")
    ledger.leave_node(PAIR.id, 0)  # an endpoint of a try that ended is never handed out
    with pytest.raises(NotAdmitted):
        nodes.node_place(ledger, PAIR, 1, preempted, wait_s=10)


def test_a_node_hears_its_job_wait_again_or_go_but_not_finish(ledger, monkeypatch):
    """Node 0 gave the slots back before this node heard the word: it checkpoints and waits too (the word);
    the job's row gone with the job unfinished: its workers stop; the job finished: nothing to stop."""
    from trainyard.scheduling.admission import lease as leases

    monkeypatch.setattr(leases, "WORD_POLL_S", 0.02)
    for ending in ("requeue", "drop", "release"):
        assert ledger.request(PAIR).admitted, ending
        with follow(ledger, PAIR, 1) as lease:
            if ending == "requeue":
                ledger.requeue(PAIR.id)
                assert lease.preempted.wait(5) and not lease.lost.is_set()
            elif ending == "drop":
                with ledger.db.transaction() as conn:  # its lease ran out and a decision dropped it
                    conn.execute("DELETE FROM admission WHERE id = ?", (PAIR.id,))
                assert lease.lost.wait(5)
                lease.lost.clear()  # (as the launcher's stop would leave it, for the next round's checks)
            else:
                ledger.release(PAIR.id)
                assert not lease.lost.wait(0.3) and not lease.preempted.is_set()
        ledger.release(PAIR.id)


def test_a_node_of_a_job_cancelled_or_no_longer_queued_does_not_wait_for_it(ledger):
    with pytest.raises(JobGone, match="neither admitted nor waiting"), follow(ledger, PAIR, 1):
        pass
    ledger.cancel(PAIR.id, "cancelled by alice (trainyard queue cancel)")
    with pytest.raises(PermanentError, match="cancelled by alice"), follow(ledger, PAIR, 1):
        pass


def test_a_host_is_reached_at_the_address_of_one_of_its_interfaces(monkeypatch):
    monkeypatch.setenv(ADDRESS_ENV, "192.0.2.77")  # TEST-NET-1: on no interface here
    with pytest.raises(PermanentError, match=f"192.0.2.77 .{ADDRESS_ENV} or its hostname's. is on none"):
        host_address()
    own = [
        (name, a.address)
        for name, addresses in psutil.net_if_addrs().items()
        if name != "lo"
        for a in addresses
        if a.family.name == "AF_INET"
    ]
    if not own:
        pytest.skip("this machine has no network interface but loopback")
    monkeypatch.setenv(ADDRESS_ENV, own[0][1])
    assert host_address() == (own[0][1], own[0][0])
