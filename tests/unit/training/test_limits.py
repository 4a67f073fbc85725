"""A job's host limits (trainyard.training.launchers.limits) and its PID namespace, with real processes, real
cgroups and the real sandbox: what a job sees of the host's processes, a fork bomb and a memory hog stopped
with a message naming the limit while another job runs on, the CPU quota as computed."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainyard.scheduling.resources import ResourcesConfig
from trainyard.spec import JobSpec
from trainyard.training.launchers import limits, sandbox
from trainyard.training.launchers.command import Command
from trainyard.training.launchers.local import LocalLauncher, LocalPlan, run


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A run directory inside a TRAINYARD_HOME and AIRFLOW_HOME of the test's own."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "trainyard"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    runs = tmp_path / "trainyard" / "runs" / "job"
    runs.mkdir(parents=True)
    return runs


def resources(team_limits: dict | None = None) -> ResourcesConfig:
    teams = {"vision": {"quota": {"cpu": 4}, "policy": {"limits": team_limits}}} if team_limits else {}
    return ResourcesConfig.model_validate(
        {
            "gpu_types": {"cpu": {"count": 8, "price_per_hour": 0.1}},
            "teams": {"default": {"quota": {"cpu": 4}}, **teams},
            "limits": {"cpus_per_slot": 1.5, "memory_gb_per_slot": 2.0, "processes": 64},
        }
    )


@pytest.mark.parametrize(
    "name, team, gpus, expected",
    [
        ("the file's limits times the slots", "default", 2, (3.0, 4 << 30, 64, "limits")),
        ("one slot", "default", 1, (1.5, 2 << 30, 64, "limits")),
        (
            "the team's own",
            "vision",
            3,
            (1.5, 3 << 29, 32, "teams.vision.policy.limits"),
        ),
    ],
)
def test_a_jobs_limits_are_its_slots_times_the_per_slot_limits_of_its_team_or_the_file(name, team, gpus, expected):
    config = resources({"cpus_per_slot": 0.5, "memory_gb_per_slot": 0.5, "processes": 32})
    spec = JobSpec.model_validate({"resources": {"team": team, "gpus_per_node": gpus}})
    got = limits.job_limits(spec, config)
    assert (got.cpus, got.memory_bytes, got.processes, got.source) == expected, name


def test_the_messages_name_the_limit_and_where_it_is_set():
    got = limits.job_limits(JobSpec.model_validate({"resources": {"gpus_per_node": 2}}), resources())
    assert got.describe("memory") == "memory limit 4 GiB (limits.memory_gb_per_slot 2 x 2 slots)"
    assert got.describe("cpu") == "CPU limit 3 cores (limits.cpus_per_slot 1.5 x 2 slots)"
    assert got.describe("pids") == "process limit 64 (limits.processes)"


def test_without_root_every_limit_not_enforced_is_said_with_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    held = limits.create("never", limits.HostLimits(cpus=1, memory_bytes=1 << 30, processes=64))
    assert held.cgroup is None
    lines = held.log_lines()
    assert len(lines) == 3 and all("NOT ENFORCED" in line and "not run as root" in line for line in lines)
    assert {line.split(": ")[2].split(" limit")[0] for line in lines} == {"memory", "CPU", "process"}


# Lists /proc: each process's pid and command line.
PS = textwrap.dedent(
    """
    import json, os
    seen = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                seen[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
            except OSError:
                seen[p] = "?"
    print(json.dumps(seen))
    """
)


@pytest.mark.sandbox
def test_a_sandboxed_program_sees_only_its_own_processes(run_dir):
    """A host process with a password in its command line is invisible: the job's /proc is its own."""
    secret = "--password=hunter2-of-another-team"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", secret])
    try:
        with sandbox.Sandbox(run_dir / "work") as box:
            lines: list[str] = []
            argv = box.command([sys.executable, "-c", PS])
            run(argv, env=box.env({"PATH": os.environ["PATH"]}), on_line=lines.append, after_exit=box.stop)
    finally:
        host.kill()
        host.wait()
    seen = json.loads(lines[-1])
    assert not [cmd for cmd in seen.values() if "hunter2" in cmd]
    assert str(os.getpid()) not in seen or "bwrap" in seen[str(os.getpid())]
    # its own: bubblewrap's init (pid 1) and the program itself, nothing of the host
    assert len(seen) == 2 and "bwrap" in seen["1"], seen
    assert [cmd for cmd in seen.values() if PS.strip()[:20] in cmd]


def launch(run_dir: Path, program: str, held: limits.HostLimits, sandboxed: bool = True) -> list[str]:
    """``program`` launched as a training's workers are, with ``held``; its output lines."""
    plan = LocalPlan(
        Command([sys.executable, "-c", program], {"PATH": os.environ["PATH"]}),
        str(run_dir),
        600.0,
        unsandboxed_because=None if sandboxed else "the test runs it as its own user",
        limits=held,
    )
    lines: list[str] = []
    LocalLauncher().launch(plan, lines.append)
    return lines


# Forks children that wait for it to end, until a fork is refused; at most 400 (no limit: it ends well, and
# the test fails).
FORK_BOMB = textwrap.dedent(
    """
    import os
    r, w = os.pipe()
    for n in range(400):
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)  # until the bomb's first process has ended
            os._exit(0)
    print("forked 400 processes")
    """
)
# Takes memory 16 MiB at a time, touching it; at most 1 GiB (no limit: it ends well, and the test fails).
MEMORY_HOG = "chunks = [b'x' * (16 << 20) for _ in range(64)]\nprint('held 1 GiB')"


@pytest.fixture
def another_job(run_dir):
    """Another job in its own sandbox, waiting: it must live on while a neighbour hits a limit."""
    other = run_dir.parent / "other"
    other.mkdir()
    held = limits.HostLimits(cpus=1, memory_bytes=1 << 30, processes=64)
    with sandbox.Sandbox(other / "work", host_limits=held) as box:
        proc = subprocess.Popen(box.command(["sleep", "600"]), env=box.env({"PATH": "/usr/bin:/bin"}))
        yield proc
        proc.kill()
        proc.wait()
        box.stop()


@pytest.mark.sandbox
def test_a_fork_bomb_stops_at_the_process_limit_with_a_message_naming_it(run_dir, another_job):
    held = limits.HostLimits(cpus=1, memory_bytes=1 << 30, processes=24, source="limits")
    with pytest.raises(limits.LimitReached, match=r"fork refused [0-9]+ times: process limit 24 \(limits.processes\)"):
        launch(run_dir, FORK_BOMB, held)
    assert another_job.poll() is None


@pytest.mark.sandbox
def test_a_memory_hog_is_killed_at_the_memory_limit_with_a_message_naming_it(run_dir, another_job):
    held = limits.HostLimits(
        cpus=1, memory_bytes=256 << 20, processes=64, slots=2, memory_gb_per_slot=0.125, source="limits"
    )
    with pytest.raises(limits.LimitReached) as caught:
        launch(run_dir, MEMORY_HOG, held)
    assert str(caught.value).startswith(
        "the job's processes were killed: memory limit 0.25 GiB (limits.memory_gb_per_slot 0.125 x 2 slots) reached"
    )
    assert "raise it in resources.yaml limits or the team's policy.limits" in str(caught.value)
    assert another_job.poll() is None


@pytest.mark.sandbox
def test_built_in_workers_outside_the_sandbox_are_held_by_a_cgroup_too(run_dir):
    """A root worker without the sandbox: the workers run as the task's user, in a cgroup of their own."""
    held = limits.HostLimits(cpus=1, memory_bytes=1 << 30, processes=24)
    with pytest.raises(limits.LimitReached, match="process limit 24"):
        launch(run_dir, FORK_BOMB, held, sandboxed=False)


@pytest.mark.sandbox
def test_the_cpu_quota_is_written_as_computed(run_dir):
    held = limits.job_limits(JobSpec.model_validate({"resources": {"gpus_per_node": 2}}), resources())
    with sandbox.Sandbox(run_dir / "work", host_limits=held) as box:
        assert box.enforcement is not None and box.enforcement.not_enforced == {}
        cgroup = box.enforcement.cgroup
        assert cgroup is not None
        version = cgroup.dirs["cpu"][1]
        if version == 2:
            assert cgroup.read("cpu", "cpu.max").split() == ["300000", "100000"]
            assert cgroup.read("memory", "memory.max").strip() == str(4 << 30)
        else:
            assert (cgroup.read("cpu", "cpu.cfs_quota_us"), cgroup.read("cpu", "cpu.cfs_period_us")) == (
                "300000\n",
                "100000\n",
            )
            assert cgroup.read("memory", "memory.limit_in_bytes").strip() == str(4 << 30)
        assert cgroup.read("pids", "pids.max").strip() == "64"
        # the job's processes are in it
        lines: list[str] = []
        argv = box.command(["cat", "/proc/self/cgroup"])
        run(argv, env=box.env({"PATH": "/usr/bin:/bin"}), on_line=lines.append, after_exit=box.stop)
        assert any(line.endswith(f"/{limits.PARENT}/{cgroup.name}") for line in lines), lines
        dirs = [d for d, _ in cgroup.dirs.values()]
    assert not any(d.exists() for d in dirs)  # removed once the launch is left
