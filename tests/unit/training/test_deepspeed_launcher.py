"""deepspeed_argv() / deepspeed_env(): the deepspeed launcher command and environment for one node."""

import socket
import sys

import pytest

from trainyard.spec import parse_spec
from trainyard.training.launchers.command import Host, local_command
from trainyard.training.launchers.deepspeed import deepspeed_argv, deepspeed_env, free_port


@pytest.mark.parametrize("nproc", [1, 2, 8])
def test_argv(nproc):
    argv = deepspeed_argv(nproc, "/x/run config.json", python="/py", master_port=29123)
    assert argv == [
        "/py",
        "-u",
        "-m",
        "deepspeed.launcher.runner",
        "--num_nodes=1",
        f"--num_accelerators={nproc}",
        "--master_port=29123",
        "--module",
        "trainyard.training.entry",
        "--config",
        "/x/run config.json",  # one argv item, never split
    ]


def test_defaults_to_this_interpreter_and_a_free_port():
    argv = deepspeed_argv(2, "c.json")
    assert argv[0] == sys.executable
    (port,) = [a.split("=", 1)[1] for a in argv if a.startswith("--master_port=")]
    assert 0 < int(port) < 65536


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("nproc", [0, -1])
def test_nproc_must_be_positive(nproc):
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        deepspeed_argv(nproc, "c.json", master_port=1)


def test_parses_with_the_deepspeed_runner():
    """The options are ones DeepSpeed 0.19.8's runner knows, and the script args reach the user script."""
    runner = pytest.importorskip("deepspeed.launcher.runner")
    args = runner.parse_args(deepspeed_argv(3, "/r.json", python="/py", master_port=29124)[4:])
    assert (args.num_nodes, args.num_gpus, args.master_port, args.module) == (1, 3, 29124, True)
    assert args.user_script == "trainyard.training.entry" and args.user_args == ["--config", "/r.json"]
    # --num_accelerators replaces the host's slots (a CPU host has one per NUMA node) with N.
    assert runner.apply_num_nodes_and_gpus({"localhost": [0]}, args.num_nodes, args.num_gpus) == {
        "localhost": [0, 1, 2]
    }


def test_the_one_builder_uses_this_launcher_and_this_env():
    """What production runs (launchers.command.local_command) is deepspeed_argv + deepspeed_env."""
    spec = parse_spec({"distributed": {"strategy": "deepspeed"}, "resources": {"gpus_per_node": 2}})
    host = Host(cuda_devices=0, cores=4, env={"X": "1"}, python="/py", master_port=29125)
    cmd = local_command(spec, host, config_path="/r.json", data_dir="/d", run_dir="/r")
    assert cmd.argv == deepspeed_argv(2, "/r.json", python="/py", master_port=29125)
    assert cmd.env == deepspeed_env(2, {"X": "1"}, cuda=False, cores=4)


@pytest.mark.parametrize(
    "base, cuda, expected",
    [
        ({}, False, "cpu"),
        ({"DS_ACCELERATOR": "cuda"}, False, "cuda"),  # an explicit choice wins
        ({}, True, None),  # GPUs: DeepSpeed detects CUDA itself
    ],
)
def test_env(base, cuda, expected):
    before = dict(base)
    env = deepspeed_env(2, base=base, cuda=cuda)
    assert env.get("DS_ACCELERATOR") == expected
    assert env["OMP_NUM_THREADS"].isdigit() and env["PYTHONUNBUFFERED"] == "1"  # worker_env's settings
    assert base == before  # not modified in place


def test_env_detects_cuda():
    import torch

    env = deepspeed_env(2, base={})
    assert ("DS_ACCELERATOR" in env) == (not torch.cuda.is_available())


def test_visible_devices_are_named_with_include_so_the_runner_keeps_them():
    """DeepSpeed's runner drops CUDA_VISIBLE_DEVICES when --num_accelerators/--num_nodes is passed and
    starts the workers on GPUs 0..N-1; the launcher names the visible GPUs with --include instead."""
    from deepspeed.launcher import runner

    argv = deepspeed_argv(2, "/r.json", python="/py", master_port=29125, visible_devices="3,5,7")
    assert "--include=localhost:3,5" in argv
    assert not any(a.startswith(("--num_nodes", "--num_accelerators")) for a in argv)
    args = runner.parse_args(argv[4:])
    assert runner.parse_inclusion_exclusion({"localhost": 8}, args.include, args.exclude) == {"localhost": [3, 5]}


@pytest.mark.parametrize("visible", ["0", "GPU-1a2b,GPU-3c4d"])
def test_visible_devices_that_cannot_be_named_are_refused(visible):
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        deepspeed_argv(2, "/r.json", master_port=1, visible_devices=visible)
