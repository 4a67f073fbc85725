"""A worker host's inventory (``TRAINYARD_GPU_DEVICES``) and the ledger's routing by GPU type: a job of a
type no live worker serves (or none with as many of its devices) waits, saying so, and holds nothing back;
a worker that announces the type lets it in; one that ends or falls silent serves it no more. The ledger's
part runs against both of its stores, announcements from concurrent processes included."""

import math

import pytest

from processes import in_processes
from trainyard.scheduling.admission.ledger import ADMITTED_LEASE_S, HOST_LEASE_S, Ledger
from trainyard.scheduling.admission.policy import Job, Standing, WaitReason
from trainyard.scheduling.admission.starts import estimate_starts
from trainyard.scheduling.hosts import HostLacksType, InventoryError, parse_inventory, training_queue_of
from trainyard.scheduling.resources import parse_resources

FLEET = """\
gpu_types:
  a100: {count: 8, price_per_hour: 1.0}
  h100: {count: 4, price_per_hour: 3.0}
  cpu: {count: 2, price_per_hour: 0.0}
teams:
  vision: {quota: {a100: 4, h100: 2, cpu: 2}}
"""


def test_a_typed_inventory_hands_each_type_only_its_own_devices():
    inventory = parse_inventory(" h100=0, 1 ; a100=MIG-1c2d/1/0,2;cpu= ")
    assert inventory.devices_for("h100") == ["0", "1"]
    assert inventory.devices_for("a100") == ["MIG-1c2d/1/0", "2"]
    assert inventory.devices_for("cpu") is None  # its slots are no devices
    with pytest.raises(HostLacksType, match=r"host 'gpu-7' has no 'v100' GPUs .*\['a100', 'cpu', 'h100'\]"):
        inventory.devices_for("v100", host="gpu-7")
    untyped = parse_inventory("0,1")  # a one-type host from before routing: its devices for any type
    assert untyped.devices_for("v100") == ["0", "1"] and not untyped.typed
    assert training_queue_of("gpu", "h100") == "gpu-h100"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("h100=0;h100=1", "'h100' is listed twice"),
        ("h100=0,0", "'h100=0,0' lists a device twice"),
        ("h100=0;a100=0", "device '0' is listed under 'h100' and 'a100'"),
        ("0,0", "lists a device twice"),
        ("cpu=0", "list it bare, 'cpu='"),
        ("h100=", "'h100' lists no devices"),
        ("H100=0", "is not '<gpu type>=<device>,<device>'"),
        ("h100=0;a100", "'a100' is not '<gpu type>=<device>,<device>'"),
        ("h100=0 1", r"\['0 1'\] in 'h100=0 1' are not device names"),
        ("h100=$(reboot)", "are not device names"),
    ],
)
def test_an_inventory_that_is_wrong_is_refused_saying_what_is(text, says):
    with pytest.raises(InventoryError, match=says):
        parse_inventory(text)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "admission.db"
    return request.getfixturevalue("postgres").database("ledger_hosts")


def _job(name: str, gpu_type: str, slots: int) -> Job:
    return Job(name, "vision", gpu_type, slots, 1, max_hours=1.0)


def test_a_job_waits_while_no_live_worker_serves_its_type_and_holds_nothing_back(where):
    clock, config = Clock(), parse_resources(FLEET)
    on = {host: Ledger(where, config, clock, host=host) for host in ("gpu-a", "gpu-b")}
    ledger = on["gpu-a"]
    assert ledger.served() is None  # no worker ever announced itself: one host, nothing routed
    assert ledger.request(_job("before", "h100", 1)).admitted
    ledger.release("before")

    on["gpu-a"].announce({"a100": ["0", "1"], "cpu": []})
    assert ledger.served() == {"a100": (2,), "cpu": (math.inf,)}
    h100 = ledger.request(_job("h", "h100", 1))
    assert h100.reason is WaitReason.UNSERVED
    assert "h100: no live worker serves it (the workers serve ['a100', 'cpu'])" in h100.message
    too_big = ledger.request(_job("big", "a100", 4))  # within the type's 8 slots, but no host has 4
    assert too_big.reason is WaitReason.UNSERVED and "needs 4 devices on one host" in too_big.message
    assert ledger.request(_job("small", "a100", 2)).admitted  # nothing held back behind them
    assert ledger.request(_job("c", "cpu", 2)).admitted
    standing = {e.job.id: v for e, v in ledger.standing()}
    assert standing["h"].reason is WaitReason.UNSERVED and standing["small"].standing is Standing.ADMITTED
    served = ledger.served()
    assert "h" not in estimate_starts(config, ledger.entries(), clock.now, served=served)  # no start in sight

    on["gpu-b"].announce({"h100": ["0"]})  # another host's devices, numbered from 0 too
    assert ledger.request(_job("h", "h100", 1)).admitted
    assert [(r.host, r.gpu_type, r.devices) for r in ledger.hosts()] == [
        ("gpu-a", "a100", ("0", "1")), ("gpu-a", "cpu", ()), ("gpu-b", "h100", ("0",))
    ]  # fmt: skip

    on["gpu-b"].retire({"h100": ["0"]})  # its worker ended: the type is served no more, its record kept
    assert ledger.request(_job("h2", "h100", 1)).reason is WaitReason.UNSERVED
    assert not any(r.live(clock.now) for r in ledger.hosts() if r.host == "gpu-b")
    clock.now += HOST_LEASE_S + 1  # gpu-a fell silent (its worker killed): its types are served no more
    assert ledger.request(_job("small2", "a100", 1)).reason is WaitReason.UNSERVED
    on["gpu-a"].announce({"a100": ["0", "1"]})  # back, without cpu: cpu is served no more
    assert ledger.request(_job("small2", "a100", 1)).admitted
    assert ledger.served() == {"a100": (2,)}


def test_a_job_no_host_can_run_keeps_no_borrower_waiting_behind_it(where):
    """Within its team's quota and waiting for slots, a job would keep borrowers back (no borrowing behind a
    job that waits for its own quota); one that no live host can run (it needs more devices than any has)
    keeps nobody back: the borrower behind it starts."""
    fleet = "gpu_types:\n  a100: {count: 4, price_per_hour: 1.0}\nteams:\n  vision: {quota: {a100: 4}}\n  nlp: {}\n"
    clock, config = Clock(), parse_resources(fleet)
    ledger = Ledger(where, config, clock, host="gpu-a")
    ledger.announce({"a100": ["0", "1", "2"]})
    assert ledger.request(Job("lent", "nlp", "a100", 2, 1, 1.0)).admitted  # borrows vision's idle quota
    assert ledger.request(Job("own", "vision", "a100", 4, 1, 1.0)).reason is WaitReason.UNSERVED
    assert ledger.request(Job("next", "nlp", "a100", 1, 1, 1.0)).admitted
    ledger.announce({"a100": ["0", "1", "2", "3"]})  # a host with four: now it waits for its quota, in front
    assert ledger.request(Job("own", "vision", "a100", 4, 1, 1.0)).reason is WaitReason.SLOTS_IN_USE
    assert ledger.request(Job("after", "nlp", "a100", 1, 1, 1.0)).reason is WaitReason.NO_BORROWING


def test_a_multi_node_job_waits_until_as_many_live_hosts_as_its_nodes_have_its_devices_each(where):
    """Its nodes run on hosts of their own: two nodes of 2 devices need two hosts with 2 each, not one with
    4; a type whose slots are no devices needs as many hosts serving it."""
    clock, config = Clock(), parse_resources(FLEET)
    on = {host: Ledger(where, config, clock, host=host) for host in ("gpu-a", "gpu-b")}
    on["gpu-a"].announce({"a100": ["0", "1", "2", "3"], "cpu": []})
    on["gpu-b"].announce({"a100": ["0"]})
    ledger = on["gpu-a"]
    assert ledger.served() == {"a100": (4, 1), "cpu": (math.inf,)}
    pair = Job("pair", "vision", "a100", 4, 1, 1.0, nodes=2)
    waits = ledger.request(pair)
    assert waits.reason is WaitReason.UNSERVED
    assert "a100: the job's 2 nodes need 2 hosts with 2 of its devices each, and 1 live host(s) have them" in (
        waits.message
    )
    assert ledger.request(Job("cpus", "vision", "cpu", 2, 1, 1.0, nodes=2)).reason is WaitReason.UNSERVED
    assert ledger.request(Job("one", "vision", "a100", 4, 1, 1.0)).admitted  # one node: the host with four
    ledger.release("one")
    on["gpu-b"].announce({"a100": ["0", "1"], "cpu": []})
    assert ledger.request(pair).admitted
    assert ledger.request(Job("cpus", "vision", "cpu", 2, 1, 1.0, nodes=2)).admitted
    assert {e.job.id: e.job.nodes for e in ledger.entries()} == {"pair": 2, "cpus": 2}  # kept in its row


def test_each_node_of_a_multi_node_job_claims_its_devices_on_its_own_host_and_node_0_says_where_to_meet(where):
    """Admitted once for all its nodes; each node's devices are its host's (numbered from 0 on each), held
    against every other job there, the same ones again on a retry; node 0's rendezvous endpoint is read by
    the others; all of it goes with the job's admission."""
    from trainyard.scheduling.admission.ledger import NoFreeDevices, NotAdmitted

    clock, config = Clock(), parse_resources(FLEET)
    on = {host: Ledger(where, config, clock, host=host) for host in ("gpu-a", "gpu-b")}
    for ledger in on.values():
        ledger.announce({"a100": ["0", "1", "2"]})
    pair = Job("pair", "vision", "a100", 4, 1, 1.0, nodes=2)
    with pytest.raises(NotAdmitted):
        on["gpu-b"].join_node("pair", 1)  # no node joins a job that is not admitted
    assert on["gpu-a"].request(pair).admitted
    assert on["gpu-a"].claim_devices("pair", 2, ["0", "1", "2"], node=0) == ["0", "1"]
    assert on["gpu-b"].claim_devices("pair", 2, ["0", "1", "2"], node=1) == ["0", "1"]  # the other host's
    assert on["gpu-b"].claim_devices("pair", 2, ["0", "1", "2"], node=1) == ["0", "1"]  # a retry: the same
    assert on["gpu-a"].endpoint("pair") is None
    on["gpu-a"].join_node("pair", 0, "10.0.0.10:29500")
    assert on["gpu-b"].endpoint("pair") == "10.0.0.10:29500"
    assert on["gpu-a"].node_devices("pair") == {0: ("gpu-a", ("0", "1")), 1: ("gpu-b", ("0", "1"))}
    assert on["gpu-a"].request(Job("one", "vision", "a100", 1, 1, 1.0)).admitted
    assert on["gpu-b"].claim_devices("one", 1, ["0", "1", "2"]) == ["2"]  # node 1's are held on gpu-b
    assert on["gpu-a"].request(Job("two", "vision", "a100", 1, 1, 1.0)).admitted
    with pytest.raises(NoFreeDevices):  # gpu-b's three are held: node 1's two and one's
        on["gpu-b"].claim_devices("two", 1, ["0", "1", "2"])
    assert not on["gpu-a"].finished("pair")
    on["gpu-a"].release("pair")
    assert on["gpu-a"].finished("pair") and on["gpu-a"].node_devices("pair") == {}
    assert on["gpu-b"].endpoint("pair") is None
    assert on["gpu-b"].claim_devices("two", 1, ["0", "1", "2"]) == ["0"]  # free again
    late = Job("late", "vision", "a100", 2, 1, 1.0, nodes=2)
    assert on["gpu-a"].request(late).admitted
    clock.now += ADMITTED_LEASE_S + 1  # its lease ran out: a multi-node row is not taken back (its nodes' went)
    assert not on["gpu-a"].reclaim(late)


def test_two_nodes_of_one_job_on_one_host_hold_different_devices_and_a_node_that_left_holds_none(where):
    clock, config = Clock(), parse_resources(FLEET)
    ledger = Ledger(where, config, clock, host="gpu-a")
    ledger.announce({"a100": ["0", "1", "2", "3"]})
    pair = Job("pair", "vision", "a100", 4, 1, 1.0, nodes=2)
    Ledger(where, config, clock, host="gpu-b").announce({"a100": ["0", "1"]})
    assert ledger.request(pair).admitted
    assert ledger.claim_devices("pair", 2, ["0", "1", "2", "3"], node=0) == ["0", "1"]
    assert ledger.claim_devices("pair", 2, ["0", "1", "2", "3"], node=1) == ["2", "3"]  # not node 0's again
    ledger.join_node("pair", 0, "10.0.0.10:29500")
    ledger.leave_node("pair", 0)  # node 0's try ended: its devices and its endpoint go at once
    assert ledger.endpoint("pair") is None and ledger.node_devices("pair") == {1: ("gpu-a", ("2", "3"))}
    assert ledger.claim_devices("pair", 2, ["0", "1", "2", "3"], node=0) == ["0", "1"]  # its retry
    ledger.join_node("pair", 0, "10.0.0.10:29501")
    assert ledger.endpoint("pair") == "10.0.0.10:29501"
    ledger.requeue("pair")  # preempted: it waits again, and no node holds anything or meets anywhere
    assert ledger.endpoint("pair") is None and ledger.node_devices("pair") == {}


def test_two_workers_of_one_host_name_serving_different_types_each_keep_theirs(where):
    config = parse_resources(FLEET)
    first, second = (Ledger(where, config, host="gpu-a") for _ in range(2))
    first.announce({"a100": ["0"]})
    second.announce({"h100": ["1"]})
    first.announce({"a100": ["0"]})
    assert first.served() == {"a100": (1,), "h100": (1,)}
    second.retire({"h100": ["1"]})
    assert first.served() == {"a100": (1,)}


def _announce_often(where, fleet: str, host: str, times: int) -> int:
    ledger = Ledger(where, parse_resources(fleet), host=host)
    for i in range(times):
        ledger.announce({"a100": [str(d) for d in range(1 + i % 3)]})
        ledger.request(_job(f"{host}-{i}", "a100", 1))
        ledger.release(f"{host}-{i}")
    return len(ledger.hosts())


def test_workers_announcing_themselves_at_once_from_their_own_processes_each_keep_one_record(where):
    Ledger(where, parse_resources(FLEET))  # made once, before the race
    counts = in_processes(_announce_often, [(where, FLEET, f"gpu-{n}", 15) for n in range(4)], timeout=300)
    assert all(1 <= c <= 4 for c in counts)
    records = Ledger(where, parse_resources(FLEET)).hosts()
    assert sorted((r.host, r.devices) for r in records) == [(f"gpu-{n}", ("0", "1", "2")) for n in range(4)]


def test_a_worker_serves_the_queues_of_its_hosts_types_and_refuses_an_inventory_it_cannot_route():
    from trainyard.errors import PermanentError
    from trainyard.scheduling.worker import worker_queues

    config = parse_resources(FLEET)
    assert worker_queues("gpu", parse_inventory("h100=0,1;cpu="), config) == ["gpu-h100", "gpu-cpu"]
    with pytest.raises(PermanentError, match=r"set TRAINYARD_GPU_DEVICES to '<type>=<devices>;\.\.\.'"):
        worker_queues("gpu", parse_inventory("0,1"), config)
    with pytest.raises(PermanentError, match=r"\['h100-80gb'\] that resources.yaml does not have"):
        worker_queues("gpu", parse_inventory("h100-80gb=0"), config)


CHILD = """\
import sys, time
from trainyard.scheduling.admission.ledger import Ledger
from trainyard.scheduling.resources import parse_resources
ledger = Ledger(sys.argv[1], parse_resources(sys.argv[2]))
deadline = time.time() + 30
while time.time() < deadline:
    if ledger.served() == {"h100": (2,), "cpu": (float("inf"),)}:
        sys.exit(7)  # seen announced from another process while its worker ran
    time.sleep(0.1)
sys.exit(1)
"""


def test_a_worker_host_is_announced_while_its_celery_worker_runs_and_retired_when_it_ends(tmp_path):
    """``serve`` with a stand-in for ``airflow celery worker``: a process that reads the ledger until it sees
    the host's types, and exits with the status that says so; the status comes back, and the host is
    retired once it has ended."""
    import sys

    from trainyard.scheduling.worker import serve

    where = tmp_path / "admission.db"
    ledger = Ledger(where, parse_resources(FLEET), host="gpu-a")
    status = serve(ledger, parse_inventory("h100=0,1;cpu="), [sys.executable, "-c", CHILD, str(where), FLEET], 0.2)
    assert status == 7
    assert [(r.gpu_type, r.live(ledger.now())) for r in ledger.hosts()] == [("cpu", False), ("h100", False)]
    assert ledger.served() == {}  # routed, and nothing serves: the types' jobs wait, saying so


DRAINING = """\
import signal, sys, time
from pathlib import Path
from trainyard.scheduling.admission.ledger import Ledger
from trainyard.scheduling.resources import parse_resources
ledger = Ledger(sys.argv[1], parse_resources(sys.argv[2]))
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append("TERM"))
signal.signal(signal.SIGINT, lambda *_: got.append("INT"))
Path(sys.argv[3]).write_text("ready")
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.05)
for _ in range(60):  # draining, as Celery's warm shutdown does: the host serves nothing by now
    if ledger.served() == {}:
        sys.exit(10 if got == ["TERM"] else 11)
    time.sleep(0.05)
sys.exit(12)
"""


def test_a_stop_retires_the_host_at_once_and_reaches_its_worker_as_a_warm_shutdown(tmp_path):
    """A Ctrl-C (SIGINT) to ``trainyard worker``: its host serves nothing from that moment (no job is
    admitted for it while its trainings finish), and the Celery worker gets SIGTERM, its warm shutdown,
    once (a SIGINT would cancel its trainings)."""
    import os
    import signal
    import sys
    import threading
    import time

    from trainyard.scheduling.worker import serve

    where, ready = tmp_path / "admission.db", tmp_path / "ready"
    ledger = Ledger(where, parse_resources(FLEET), host="gpu-a")

    def interrupt() -> None:
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    child = [sys.executable, "-c", DRAINING, str(where), FLEET, str(ready)]
    assert serve(ledger, parse_inventory("h100=0"), child, 0.2) == 10


def test_a_worker_whose_trainyard_worker_is_killed_dies_with_it(tmp_path):
    """``trainyard worker`` SIGKILLed (its announcement lapses): the Celery worker under it gets SIGTERM
    rather than serving on, unannounced."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    serving = (
        "import sys\n"
        "from trainyard.scheduling.admission.ledger import Ledger\n"
        "from trainyard.scheduling.hosts import parse_inventory\n"
        "from trainyard.scheduling.resources import parse_resources\n"
        "from trainyard.scheduling.worker import serve\n"
        "ledger = Ledger(sys.argv[1], parse_resources(sys.argv[2]), host='gpu-a')\n"
        "child = 'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(60)'\n"
        "serve(ledger, parse_inventory('h100=0'), [sys.executable, '-c', child, sys.argv[3]], 0.2)\n"
    )
    pid_file = tmp_path / "celery.pid"
    parent = subprocess.Popen([sys.executable, "-c", serving, str(tmp_path / "admission.db"), FLEET, str(pid_file)])
    try:
        deadline = time.time() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        worker = psutil.Process(int(pid_file.read_text()))
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)

        def gone() -> bool:
            try:
                return worker.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        while not gone() and time.time() < deadline:
            time.sleep(0.1)
        assert gone(), "the worker outlived trainyard worker"
    finally:
        parent.kill()
