"""The local launcher: one pure builder for every strategy (table-driven), the GPU-count check, the process
runner, and launch() writing a usage record for every try, failed and interrupted ones too."""

import json
import re
import sys
from pathlib import Path

import pytest

from datafiles import prepared_in
from trainyard.errors import PermanentError
from trainyard.spec import parse_spec
from trainyard.training import usage
from trainyard.training.launchers import local
from trainyard.training.launchers.command import Host, NodePlace, local_command, torchrun_argv
from trainyard.training.launchers.local import LaunchError, run, worker_env

CONFIG = "/runs/a b/run_config.json"  # a space: must stay one argv item
RUN_DIR = "/runs/a b"
DATA = "/cache/prepared/abc"
CPU = Host(cuda_devices=0, cores=8, env={"PATH": "/bin"}, python="/venv/bin/python")
TORCHRUN = ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
ENTRY = ["-m", "trainyard.training.entry", "--config", CONFIG]
LOOPBACK = "--local-addr=127.0.0.1"  # torchrun's rendezvous in the sandbox's network namespace
CUSTOM = {"recipe": "custom", "custom": {"command": ["python", "train.py", "--lr", "$(LR); rm -rf /"]}}

# name, spec overrides, host, expected argv, expected env (a subset), env keys that must be absent
CASES = [
    (
        "ddp",
        {"distributed": {"strategy": "ddp", "max_restarts": 2}},
        CPU,
        [*TORCHRUN, "--nproc_per_node=2", "--max_restarts=2", LOOPBACK, *ENTRY],
        {"OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PATH": "/bin"},
        ["DS_ACCELERATOR", "TRAINYARD_DATA_DIR"],
    ),
    (
        "horovod",
        {"distributed": {"strategy": "horovod"}, "resources": {"gpus_per_node": 4}},
        CPU,
        ["/venv/bin/horovodrun", "-np", "4", "-H", "localhost:4", "--gloo", "/venv/bin/python", *ENTRY],
        {"OMP_NUM_THREADS": "2"},
        ["DS_ACCELERATOR"],
    ),
    (
        "deepspeed on cpu",
        {"distributed": {"strategy": "deepspeed"}},
        CPU,
        [*TORCHRUN, "--nproc_per_node=2", "--max_restarts=1", LOOPBACK, *ENTRY],
        {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1"},
        [],
    ),
    (
        "deepspeed on gpus",
        {"distributed": {"strategy": "deepspeed"}},
        Host(2, 8, {}, "/venv/bin/python"),
        [*TORCHRUN, "--nproc_per_node=2", "--max_restarts=1", LOOPBACK, *ENTRY],
        {"OMP_NUM_THREADS": "4"},
        ["DS_ACCELERATOR"],
    ),
    (
        "deepspeed, the user's accelerator wins",
        {"distributed": {"strategy": "deepspeed"}},
        Host(0, 8, {"DS_ACCELERATOR": "xpu"}, "/venv/bin/python"),
        None,
        {"DS_ACCELERATOR": "xpu"},
        [],
    ),
    (
        "the user's thread count wins",
        {},
        Host(0, 8, {"OMP_NUM_THREADS": "3"}, "/p"),
        None,
        {"OMP_NUM_THREADS": "3"},
        [],
    ),
    (
        "custom",
        {**CUSTOM, "resources": {"gpus_per_node": 3}, "distributed": {"max_restarts": 0}},
        CPU,
        [
            *TORCHRUN,
            "--nproc_per_node=3",
            "--max_restarts=0",
            "--local-addr=127.0.0.1",
            "--no-python",
            "python",
            "train.py",
            "--lr",
            "$(LR); rm -rf /",
        ],
        {
            "TRAINYARD_DATA_DIR": DATA,
            "TRAINYARD_OUTPUT_DIR": f"{RUN_DIR}/work",
            "TRAINYARD_CHECKPOINT_DIR": f"{RUN_DIR}/work/checkpoints",
            "TRAINYARD_METRICS_FILE": f"{RUN_DIR}/work/metrics.jsonl",
            "OMP_NUM_THREADS": "2",
        },
        [],
    ),
    (
        "custom ignores the strategy",
        {**CUSTOM, "distributed": {"strategy": "deepspeed"}},
        CPU,
        [
            *TORCHRUN,
            "--nproc_per_node=2",
            "--max_restarts=1",
            "--local-addr=127.0.0.1",
            "--no-python",
            *CUSTOM["custom"]["command"],
        ],
        {},
        ["DS_ACCELERATOR"],
    ),
    (
        "one thread at least",
        {"resources": {"gpus_per_node": 8}},
        Host(0, 2, {}, "/p"),
        None,
        {"OMP_NUM_THREADS": "1"},
        [],
    ),
]


@pytest.mark.parametrize("name, overrides, host, argv, env, absent", CASES, ids=[c[0] for c in CASES])
def test_local_command(name, overrides, host, argv, env, absent):
    before = dict(host.env)
    cmd = local_command(parse_spec(overrides), host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR)
    if argv is not None:
        assert cmd.argv == argv
    assert env.items() <= cmd.env.items()
    assert not set(absent) & set(cmd.env)
    assert dict(host.env) == before  # the host's environment is not modified


@pytest.mark.parametrize(
    "name, gpus_per_node, cuda_devices, ok",
    [
        ("cpu-only machine: CPU workers, any count", 2, 0, True),
        ("one GPU, one worker", 1, 1, True),
        ("enough GPUs", 4, 8, True),
        ("the default 2 on a one-GPU machine", 2, 1, False),
        ("more than the machine has", 8, 4, False),
    ],
)
def test_gpu_count_is_checked_before_anything_starts(name, gpus_per_node, cuda_devices, ok):
    spec = parse_spec({"resources": {"gpus_per_node": gpus_per_node}})
    host = Host(cuda_devices=cuda_devices, cores=4)
    if ok:
        assert local_command(spec, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR).argv
        return
    with pytest.raises(PermanentError) as err:
        local_command(spec, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR)
    message = str(err.value)
    assert "resources.gpus_per_node" in message and f"is {gpus_per_node}" in message
    assert f"has {cuda_devices} CUDA GPU(s)" in message and f"at most {cuda_devices}" in message


def test_torchrun_argv_nproc_must_be_positive():
    with pytest.raises(ValueError):
        torchrun_argv(0, "c.json")


def test_worker_env_limits_threads():
    assert worker_env(2, base={}, cores=8)["OMP_NUM_THREADS"] == "4"
    assert worker_env(2, base={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    # the host's slots share its cores: a 1-process job on a 4-slot host does not take all 8 cores
    assert worker_env(1, base={}, cores=8, slots=4)["OMP_NUM_THREADS"] == "2"
    assert worker_env(4, base={}, cores=8, slots=2)["OMP_NUM_THREADS"] == "2"  # never more than cores per worker


@pytest.mark.parametrize(
    "host, gpu_type, threads",
    [
        (Host(cuda_devices=0, cores=8, cpu_slots=2), "cpu", "4"),  # a CPU slot's share of the cores
        (Host(cuda_devices=0, cores=8), "cpu", "8"),  # no pool known: this job's one worker takes them all
        (Host(cuda_devices=4, cores=16, cpu_slots=2), "a100-80gb", "4"),  # a GPU job: a GPU's share
        (Host(cuda_devices=4, cores=16, cpu_slots=2), "cpu", "8"),  # a cpu job on that host: a CPU slot's
    ],
)
def test_a_job_takes_its_slots_share_of_the_cores_not_all_of_them(host, gpu_type, threads):
    """Two jobs of the same pool side by side must not both start a thread per core (they would spin-wait
    on each other's cores): each worker gets cores / slots threads, whatever the job's own size."""
    for strategy in ("ddp", "horovod", "deepspeed"):
        resources = {"gpus_per_node": 1, "gpu_type": gpu_type}
        job = parse_spec({"resources": resources, "distributed": {"strategy": strategy}})
        cmd = local_command(job, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR)
        assert cmd.env["OMP_NUM_THREADS"] == threads, strategy


def test_this_host_knows_the_cpu_pool():
    from trainyard.scheduling.resources import load_resources
    from trainyard.training.launchers.local import this_host

    assert this_host().cpu_slots == load_resources().gpu_types["cpu"].count


def test_run_streams_lines_and_reports_failure():
    lines = []
    run([sys.executable, "-c", "print('a'); print('b')"], on_line=lines.append)
    assert lines == ["a", "b"]
    with pytest.raises(LaunchError, match="exited with 3; last lines:\nboom"):
        run([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], on_line=lambda _: None)


# -- launch(): the pipeline's entry point, with real torchrun and a one-process custom command -----------
def _custom(tmp_path: Path, code: str):
    spec = parse_spec(
        {
            "recipe": "custom",
            "resources": {"gpus_per_node": 1},
            "distributed": {"max_restarts": 0},
            "custom": {"command": [sys.executable, "-c", code]},
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "prepared").mkdir()
    return spec, prepared_in(tmp_path / "prepared"), run_dir


def _preempted(spec, data, run_dir: Path, on_line, preemption: local.Preemption) -> local.Preempted:
    """What ``launch`` raises for a job told to stop by ``preemption``: it must stop, never end normally."""
    with pytest.raises(local.Preempted) as stopped:
        local.launch(spec, data, run_dir=str(run_dir), config_path="c.json", on_line=on_line, preemption=preemption)
    return stopped.value


def test_no_worker_gets_the_tasks_secrets():
    task_env = {
        "PATH": "/usr/bin",
        "AIRFLOW__CORE__FERNET_KEY": "k",
        "TRAINYARD_SIGNING_KEY": "pem",
        "AWS_SECRET_ACCESS_KEY": "s",
        "TRAINYARD_HOME": "/var/ty",
        "OMP_PROC_BIND": "close",
    }
    host = Host(0, 4, task_env, "/p")
    env = local_command(parse_spec(CUSTOM), host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR).env
    assert env["PATH"] == "/usr/bin"
    secrets = {"AIRFLOW__CORE__FERNET_KEY", "TRAINYARD_SIGNING_KEY", "AWS_SECRET_ACCESS_KEY"}
    assert not (secrets | {"TRAINYARD_HOME"}) & set(env)
    for strategy in ("ddp", "horovod", "deepspeed"):
        spec = parse_spec({"distributed": {"strategy": strategy}})
        built_in = local_command(spec, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR).env
        assert not secrets & set(built_in)
        # the trainer's own settings stay: its home (a recipe's input files) and the libraries' tuning
        assert built_in["TRAINYARD_HOME"] == "/var/ty" and built_in["OMP_PROC_BIND"] == "close"


def test_a_custom_program_gets_its_hyperparameters_and_in_a_trial_the_verdict_file():
    import json

    spec = parse_spec({**CUSTOM, "hyperparameters": {"learning_rate": 0.003, "epochs": 4}})
    host = Host(0, 4, {"PATH": "/usr/bin"}, "/p")
    env = local_command(spec, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR).env
    given = json.loads(env["TRAINYARD_HYPERPARAMETERS"])
    assert (given["learning_rate"], given["epochs"]) == (0.003, 4) and "TRAINYARD_TRIAL_VERDICT_FILE" not in env
    trial = local_command(spec, host, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR, trial=True).env
    assert trial["TRAINYARD_TRIAL_VERDICT_FILE"] == f"{RUN_DIR}/work/trial_verdict.json"


@pytest.mark.sandbox
def test_launch_runs_the_command_with_the_platform_env_and_records_the_try(tmp_path):
    code = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('TRAINYARD_')}))"
    spec, data, run_dir = _custom(tmp_path, code)
    lines = []
    local.launch(spec, data, run_dir=str(run_dir), config_path=str(run_dir / "run_config.json"), on_line=lines.append)
    (env_line,) = [line for line in lines if "TRAINYARD_DATA_DIR" in line]
    env = json.loads(env_line[env_line.index("{") :])
    assert env["TRAINYARD_DATA_DIR"] == data.path and env["TRAINYARD_OUTPUT_DIR"] == str(run_dir / "work")
    (record,) = usage.tries(run_dir)
    assert (record["attempt"], record["gpus"], record["where"]) == (1, 1, "local")
    assert 0 < record["ended"] - record["started"] < 120


@pytest.mark.sandbox
def test_a_failed_try_is_recorded_and_the_next_try_numbers_on(tmp_path):
    spec, data, run_dir = _custom(tmp_path, "raise SystemExit(4)")
    for _ in range(2):
        with pytest.raises(LaunchError):
            local.launch(spec, data, run_dir=str(run_dir), config_path="c.json", on_line=lambda _: None)
    assert [t["attempt"] for t in usage.tries(run_dir)] == [1, 2]
    assert usage.gpu_seconds(run_dir) > 0


@pytest.mark.sandbox
def test_an_interrupted_try_is_recorded(tmp_path):
    spec, data, run_dir = _custom(tmp_path, "import time; print('work' + 'er up', flush=True); time.sleep(60)")

    def interrupt(line):
        if line.endswith("worker up"):  # the worker's line, not the launch command that contains its code
            raise KeyboardInterrupt  # as a task timeout or "mark failed" interrupts the task

    with pytest.raises(KeyboardInterrupt):
        local.launch(spec, data, run_dir=str(run_dir), config_path="c.json", on_line=interrupt)
    (record,) = usage.tries(run_dir)
    assert record["ended"] - record["started"] < 30  # the workers were killed, not waited for


@pytest.mark.sandbox
def test_a_spec_the_machine_cannot_run_starts_nothing_and_records_nothing(tmp_path, monkeypatch):
    spec, data, run_dir = _custom(tmp_path, "print('ran')")
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus_per_node": 4})})
    monkeypatch.setattr(local, "this_host", lambda: Host(cuda_devices=1, cores=4))
    with pytest.raises(PermanentError, match="resources.gpus_per_node"):
        local.launch(spec, data, run_dir=str(run_dir), config_path="c.json", on_line=lambda _: None)
    assert usage.tries(run_dir) == []


def test_a_run_once_sandboxed_is_not_resumed_outside_the_sandbox(tmp_path, monkeypatch):
    """Its checkpoints were written by a sandbox user (and a checkpoint is a pickle): a later try on a host
    that cannot sandbox now waits for one that can instead of loading them as the task's user."""
    from trainyard.training.launchers import sandbox
    from trainyard.training.run_config import RunConfig

    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "no sandbox users")
    spec = parse_spec({})
    config = RunConfig(spec=spec, data=prepared_in(DATA), out_dir=str(tmp_path / "work")).dump(tmp_path / "run.json")
    launcher = local.LocalLauncher(Host(0, 2, {}, "/p"))
    plan = launcher.plan(spec, prepared_in(DATA), run_dir=str(tmp_path), config_path=str(config))
    assert not plan.sandboxed and plan.unsandboxed_because == "no sandbox users"
    (tmp_path / local.SANDBOXED_MARK).touch()
    with pytest.raises(sandbox.SandboxError, match="resumed only inside one; this host cannot sandbox now"):
        launcher.plan(spec, prepared_in(DATA), run_dir=str(tmp_path), config_path=str(config))


def test_the_workers_are_stopped_when_the_job_loses_its_admission():
    """``stop`` (the lease's ``lost``) ends the child's process group as a timeout does; the launch fails."""
    import threading
    import time

    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(LaunchError):
        run([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"], stop=stop)
    assert time.monotonic() - started < 30


# -- a preemption as a custom program meets it: SIGTERM, its grace in the environment, then the kill -----
@pytest.mark.sandbox
def test_a_custom_program_told_by_sigterm_ends_in_its_grace_and_the_launch_is_preempted(tmp_path):
    import threading

    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('checkpointed within', os.environ['"
        + local.GRACE_ENV
        + "'], flush=True), sys.exit(0)))\n"
        "print('work' + 'er up', flush=True)\n"
        "time.sleep(120)\n"
    )
    spec, data, run_dir = _custom(tmp_path, code)
    word, lines = threading.Event(), []

    def on_line(line):
        lines.append(line)
        if line.endswith("worker up"):
            word.set()

    stopped = _preempted(spec, data, run_dir, on_line, local.Preemption(word, 20))
    assert re.search("its program ended after SIGTERM .*same arguments", str(stopped)), stopped
    assert any(line.endswith("checkpointed within 20") for line in lines)
    (record,) = usage.tries(run_dir)
    assert record["ended"] - record["started"] < 30


@pytest.mark.sandbox
def test_a_custom_program_deaf_to_sigterm_is_killed_after_its_grace(tmp_path):
    import threading
    import time

    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    code = f"{deaf}; print('work' + 'er up', flush=True); time.sleep(120)"
    spec, data, run_dir = _custom(tmp_path, code)
    word = threading.Event()
    started = time.monotonic()
    on_line = lambda line: word.set() if line.endswith("worker up") else None  # noqa: E731
    stopped = _preempted(spec, data, run_dir, on_line, local.Preemption(word, 2))
    assert "did not end within the 2 s grace and were killed" in str(stopped)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("index", [0, 1])
def test_a_node_of_several_joins_node_0_s_rendezvous_at_its_own_address(index):
    """Each node runs torchrun with c10d's rendezvous at node 0's endpoint (node 0 serves its store), is
    reached at its host's address, and its workers' collectives bind the interface that has it."""
    spec = parse_spec({"resources": {"nodes": 2, "min_nodes": 1, "gpus_per_node": 1}})
    place = NodePlace(index, "10.0.0.10:29500", "train_pipeline-run1", f"10.0.0.1{index}", "eth0")
    command = local_command(spec, CPU, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR, node=place)
    argv = command.argv
    assert "--standalone" not in argv and "--nnodes=1:2" in argv and "--rdzv_backend=c10d" in argv
    assert "--rdzv_endpoint=10.0.0.10:29500" in argv and "--rdzv_id=train_pipeline-run1" in argv
    (conf,) = [a for a in argv if a.startswith("--rdzv_conf=")]
    assert conf.endswith(f",is_host={'true' if index == 0 else 'false'}") and "last_call_timeout=" in conf
    assert f"--local-addr=10.0.0.1{index}" in argv
    assert command.env["GLOO_SOCKET_IFNAME"] == command.env["NCCL_SOCKET_IFNAME"] == "eth0"
    alone = local_command(parse_spec({}), CPU, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR)
    assert "--standalone" in alone.argv and "--local-addr=127.0.0.1" in alone.argv
    assert "GLOO_SOCKET_IFNAME" not in alone.env
    with pytest.raises(PermanentError, match="each node needs its place"):
        local_command(spec, CPU, config_path=CONFIG, data_dir=DATA, run_dir=RUN_DIR)


def test_each_node_records_its_own_gpus_and_node_0_s_records_are_the_job_s_tries(tmp_path):
    for node, (started, ended) in ((0, (0.0, 10.0)), (1, (1.0, 10.0)), (0, (20.0, 30.0))):
        usage.record_try(tmp_path, attempt=1, started=started, ended=ended, gpus=2, where="local", node=node)
    assert [t["started"] for t in usage.tries(tmp_path)] == [0.0, 20.0]  # the job's two tries
    assert usage.wall_seconds(tmp_path) == 20.0
    assert usage.gpu_seconds(tmp_path) == (10 + 9 + 10) * 2  # every node's GPU time is billed
    assert [r.get("node", 0) for r in usage.records(tmp_path)] == [0, 1, 0]
