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


def _job(tmp_path: Path, prepared, epochs: int):
    """A 2-node digits JobSpec with its run config on a shared volume (``home``) holding the prepared data."""
    spec = parse_spec(
        {
            "name": "digits-two-nodes",
            "hyperparameters": {"epochs": epochs, "batch_size": 32, "learning_rate": 0.1, "momentum": 0.9, "seed": 3},
            "resources": {"nodes": 2, "gpus_per_node": 1, "gpu_type": "cpu"},
            "backends": {"launcher": "kubernetes"},
            "kubernetes": {"cpu_per_gpu": "1"},  # two pods on two cores
        }
    )
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


def _start_pods(two_hosts, tmp_path: Path, job, attempt: int = 1) -> tuple[list[subprocess.Popen], list[Path]]:
    """Each pod of try ``attempt``'s rendered Job, started as a process in its own namespace."""
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
    for i, netns in enumerate(two_hosts):
        etc_hosts = tmp_path / f"hosts-{attempt}-{i}"  # the kubelet's, and the other pod's from the cluster's DNS
        short = hosts[i].split(".", 1)[0]
        other = 1 - i
        etc_hosts.write_text(
            f"127.0.0.1 localhost\n{ADDRESSES[i]} {hosts[i]} {short}\n{ADDRESSES[other]} {hosts[other]}\n"
        )
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), **_pod_env(container, i)}
        argv = [
            "ip", "netns", "exec", netns,
            "bwrap", "--dev-bind", "/", "/", "--bind", str(home), K.TRAINYARD_HOME,
            "--ro-bind", str(etc_hosts), "/etc/hosts", "--unshare-uts", "--hostname", short, "--die-with-parent",
            "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *container.command,
        ]  # fmt: skip
        out = tmp_path / f"pod-{attempt}-{i}.log"
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
