"""Multi-node training for real, the Kubernetes path: the two pods that the rendered Indexed Job of a
2-node JobSpec describes, run as processes on this machine, each in a network namespace of its own with
an address of its own (as a pod on another node has), the hostname and /etc/hosts the kubelet gives a pod
of a headless Service's subdomain (``<job>-<i>``, its fully qualified name), the shared volume at
``/var/trainyard``, and exactly the command and environment of the pod template (the completion index
filled in as the Job controller does). Nothing else changes: their torchruns rendezvous by c10d over TCP
to pod 0's address, train together with gloo (one rank per pod), and rank 0 writes the one result.

Skipped where it cannot run: network namespaces need root, ``ip`` (iproute2) and ``bwrap``.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from trainyard.spec import parse_spec
from trainyard.training.launchers import kubernetes as K
from trainyard.training.run_config import RunConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("bwrap"),
        reason="network namespaces need root, iproute2 and bubblewrap",
    ),
]
LIMIT_S = 600  # a rendezvous or a collective that hangs fails the test instead of the suite
ADDRESSES = ("10.231.0.1", "10.231.0.2")  # each pair of namespaces has its own network: no clash
RUN_KEY = "train_pipeline.default/manual__multinode"


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair, ``ADDRESSES`` theirs; gone afterwards."""
    tag = uuid.uuid4().hex[:6]
    names = [f"ty{tag}n{i}" for i in range(2)]
    ends = [f"ty{tag}v{i}" for i in range(2)]

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        try:
            ip("netns", "add", names[0])
        except subprocess.CalledProcessError as err:  # root without CAP_SYS_ADMIN (an unprivileged container)
            pytest.skip(f"no network namespace can be made here: {err.stderr.decode().strip()}")
        ip("netns", "add", names[1])
        ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        for name, end, address in zip(names, ends, ADDRESSES, strict=True):
            ip("link", "set", end, "netns", name)
            ip("-n", name, "addr", "add", f"{address}/24", "dev", end)
            ip("-n", name, "link", "set", end, "up")
            ip("-n", name, "link", "set", "lo", "up")
        yield names
    finally:
        subprocess.run(["ip", "link", "del", ends[0]], capture_output=True)  # where it never left this namespace
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _pod_env(container, index: int) -> dict[str, str]:
    """The container's environment as the kubelet gives it to pod ``index`` (the completion index is the
    only value taken from the pod)."""
    env = {}
    for var in container.env:
        if var.value_from is not None:
            assert var.value_from.field_ref.field_path == K.INDEX_FIELD, var
            env[var.name] = str(index)
        else:
            env[var.name] = var.value
    return env


def _job(tmp_path: Path, prepared, epochs: int, batch_size: int = 32, **more: dict):
    """A 2-node digits JobSpec with its run config on a shared volume (``home``) holding the prepared data;
    ``more``: sections merged into the spec's."""
    raw: dict = {
        "name": "digits-two-nodes",
        "hyperparameters": {
            "epochs": epochs, "batch_size": batch_size, "learning_rate": 0.1, "momentum": 0.9, "seed": 3,
        },
        "resources": {"nodes": 2, "gpus_per_node": 1, "gpu_type": "cpu"},
        "backends": {"launcher": "kubernetes"},
        "kubernetes": {"cpu_per_gpu": "1"},  # two pods on two cores
    }  # fmt: skip
    for section, fields in more.items():
        raw[section] = {**raw.get(section, {}), **fields}
    spec = parse_spec(raw)
    home = tmp_path / "home"  # the shared volume, as the worker mounts it
    moved = home / "cache" / "prepared" / "digits"
    shutil.copytree(prepared.path, moved)
    data = prepared.model_copy(
        update={
            "path": str(moved),
            "train": str(moved / Path(prepared.train).name),
            "val": str(moved / Path(prepared.val).name),
        }
    )
    run_dir = home / "runs" / spec.name / "run1"
    (run_dir / "work").mkdir(parents=True)
    cfg = RunConfig(
        spec=spec, data=data, out_dir=str(run_dir / "work"), metrics_file=str(run_dir / "work" / "metrics.jsonl")
    )
    return spec, home, data, run_dir, str(cfg.dump(run_dir / "run_config.json"))


def _start_pods(
    two_hosts, tmp_path: Path, job, attempt: int = 1, indexes: tuple[int, ...] = (0, 1), tag: str = ""
) -> tuple[list[subprocess.Popen], list[Path]]:
    """The pods ``indexes`` of try ``attempt``'s rendered Job, each started as a process in its own namespace
    (``tag`` names a pod that the Job controller started again)."""
    spec, home, data, run_dir, config_path = job
    plan = K.KubernetesLauncher(RUN_KEY, attempt, home).plan(spec, data, run_dir=str(run_dir), config_path=config_path)
    service, indexed = plan.objects
    container = indexed.spec.template.spec.containers[0]
    assert indexed.spec.completion_mode == "Indexed" and indexed.spec.completions == 2
    assert indexed.spec.template.spec.subdomain == service.metadata.name  # the pods' names resolve under it
    Path(K.TRAINYARD_HOME).mkdir(parents=True, exist_ok=True)  # the mount point of the volume in the pods
    hosts = [K.pod_host(spec, RUN_KEY, i, attempt=attempt) for i in range(2)]
    procs: list[subprocess.Popen] = []
    outputs: list[Path] = []
    for i in indexes:
        netns = two_hosts[i]
        etc_hosts = tmp_path / f"hosts-{attempt}-{i}"  # the kubelet's, and the other pod's from the cluster's DNS
        short = hosts[i].split(".", 1)[0]
        other = 1 - i
        etc_hosts.write_text(
            f"127.0.0.1 localhost\n{ADDRESSES[i]} {hosts[i]} {short}\n{ADDRESSES[other]} {hosts[other]}\n"
        )
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LOGLEVEL": "INFO",  # torchrun's rendezvous rounds, with their times, in the pod's log
            **_pod_env(container, i),
        }
        argv = [
            "ip", "netns", "exec", netns,
            "bwrap", "--dev-bind", "/", "/", "--bind", str(home), K.TRAINYARD_HOME,
            "--ro-bind", str(etc_hosts), "/etc/hosts", "--unshare-uts", "--hostname", short, "--die-with-parent",
            "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *container.command,
        ]  # fmt: skip
        out = tmp_path / f"pod-{attempt}-{i}{tag}.log"
        outputs.append(out)
        try:
            with out.open("w") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        except BaseException:  # the pod started first would wait for the second at the rendezvous: end it
            _kill_all(procs)
            raise
    return procs, outputs


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """Every process of the pods, their trainers included (torchrun starts those in sessions of their own)."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(proc.pid)
            for p in [tree, *tree.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGKILL)


def _wait(procs: list[subprocess.Popen], outputs: list[Path], timeout: float = LIMIT_S) -> list[str]:
    """Both pods' output once both have ended; a failure, or pods still running after ``timeout`` seconds
    (then killed), shows both pods' output."""
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        _kill_all(procs)
    codes = [p.wait(10) for p in procs]
    logs = [out.read_text() for out in outputs]
    report = "\n".join(
        f"--- pod {i} (exit {c})\n{log[-4000:]}" for i, (c, log) in enumerate(zip(codes, logs, strict=True))
    )
    assert codes == [0, 0], report
    return logs


def test_two_pods_of_the_rendered_job_train_together_across_network_namespaces(two_hosts, prepared, tmp_path):
    job = _job(tmp_path, prepared, epochs=2)
    logs = _wait(*_start_pods(two_hosts, tmp_path, job))
    # each pod ran one rank of one world of two: rank 0 on pod 0, rank 1 on pod 1, across the namespaces
    assert "[rank 0]:" in logs[0] and "[rank 1]:" not in logs[0], logs[0][-3000:]
    assert "[rank 1]:" in logs[1] and "[rank 0]:" not in logs[1], logs[1][-3000:]
    assert "world_size=2" in logs[0], logs[0][-3000:]
    run_dir = job[3]
    result = json.loads((run_dir / "work" / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["epochs"] == 2 and result["val_accuracy"] > 0.5, result
    assert (run_dir / "work" / "model.pt").is_file()


def _until(output: Path, words: str, after: int, pods: list[subprocess.Popen], timeout: float = 120) -> int:
    """The offset in ``output`` (a pod's log) just past the first ``words`` found after offset ``after``,
    waiting for them; an AssertionError with the log once ``timeout`` seconds pass or every pod has ended."""
    deadline = time.monotonic() + timeout
    while True:
        text = output.read_text()
        found = text.find(words, after)
        if found >= 0:
            return found + len(words)
        if time.monotonic() > deadline or all(p.poll() is not None for p in pods):
            raise AssertionError(f"no {words!r} in {output.name}:\n{text[-4000:]}")
        time.sleep(0.1)


EPOCHS = 60  # about 20 s of steps alone on an idle 2-core machine: still training when the new pod comes
REPLACED_AFTER_S = 30  # from a pod's loss to the Job's new pod for its index (Kubernetes: its node's
# NotReady, 40 s, then NODE_LOST_S, then the new pod's start)


@pytest.mark.parametrize(
    "min_nodes",
    [
        1,
        pytest.param(
            None,  # plain checkpoint-restart: the figures BENCHMARKS.md compares with; the suite runs elastic only
            marks=pytest.mark.skipif(not os.environ.get("TRAINYARD_BENCH_NODE_LOSS"), reason="a benchmark's run"),
        ),
    ],
    ids=["elastic", "waiting"],
)
def test_a_pod_lost_mid_epoch_its_node_goes_on_and_takes_its_new_pod_back(two_hosts, prepared, tmp_path, min_nodes):
    """Pod 1 and everything in it killed mid-epoch, as when its node dies. Elastic (min_nodes 1), pod 0's
    torchrun goes on alone from the newest checkpoint, each worker's position carried over by samples; the
    new pod 1 that the Job starts (its pod failure policy ignores an eviction) rejoins, and both finish the
    run. Without min_nodes, pod 0 waits for the new pod and both go on from the checkpoint."""
    job = _job(
        tmp_path, prepared, epochs=EPOCHS, batch_size=8,  # 183 steps an epoch alone: still at it when the new pod comes
        hyperparameters={"learning_rate": 0.02}, resources={"min_nodes": min_nodes}, checkpointing={"every_steps": 50},
    )  # fmt: skip
    procs, outputs = _start_pods(two_hosts, tmp_path, job)
    spare: list[subprocess.Popen] = []
    try:
        seen = _until(outputs[0], "checkpoint step-", 0, procs)  # the first checkpoint: well into epoch 1
        time.sleep(1)
        _kill_all(procs[1:])
        killed = time.monotonic()
        alone = None
        if min_nodes is not None:
            seen = _until(outputs[0], "resuming on 1 worker(s) what 2 trained", seen, procs[:1])
            seen = _until(outputs[0], "resumed from checkpoint", seen, procs[:1])
            alone = time.monotonic() - killed
        time.sleep(max(0.0, REPLACED_AFTER_S - (time.monotonic() - killed)))
        spare, spare_out = _start_pods(two_hosts, tmp_path, job, indexes=(1,), tag="-new")
        back = _until(outputs[0], "[trainer] strategy=ddp world_size=2", seen, [procs[0], *spare])
        both = time.monotonic() - killed
        logs = _wait([procs[0], *spare], [outputs[0], *spare_out])
    finally:
        _kill_all(procs + spare)
    resumed = [int(s) for s in re.findall(r"resumed from checkpoint step-\d+\.pt at step (\d+)", logs[0])]
    alone_words = f"on 1 node {alone:.1f} s after the kill, " if alone is not None else "nothing on 1 node, "
    print(f"\nnode loss ({'elastic' if min_nodes else 'waiting'}): training again {alone_words}on 2 nodes "
          f"{both:.1f} s after it; resumed from the checkpoint of step {resumed[0]} (every 50 steps); "
          f"{resumed[1] - resumed[0] if len(resumed) > 1 else 0} steps of batch 8 trained alone")  # fmt: skip
    result = json.loads((job[3] / "work" / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["epochs"] == EPOCHS and result["val_accuracy"] > 0.5, result
    assert "[rank 1]:" in logs[1] and "[rank 0]:" not in logs[1], logs[1][-3000:]  # the new pod: rank 1
    if min_nodes is not None:
        # it went on alone (the new pod is started only once it has), then took the new pod back
        assert "resuming on 2 worker(s) what 1 trained" in logs[0][:back], logs[0][-3000:]
        assert len(resumed) >= 2 and resumed[1] > resumed[0], resumed  # steps trained by one node meanwhile
    else:
        assert "resuming on" not in logs[0] and "resumed from checkpoint" in logs[0][:back], logs[0][-3000:]
