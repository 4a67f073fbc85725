"""DeepSpeed's local command: torchrun (as for ddp, and as on Kubernetes) with deepspeed_env()."""

import socket

import pytest

from trainyard.spec import parse_spec
from trainyard.training.launchers.command import Host, local_command, torchrun_argv
from trainyard.training.launchers.deepspeed import deepspeed_env, free_port


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("cuda_devices, visible", [(0, None), (4, "3,5")])
def test_the_one_builder_starts_deepspeed_under_torchrun(cuda_devices, visible):
    """The same torchrun command as ddp (restarts included); CUDA_VISIBLE_DEVICES passes through untouched,
    so the workers take cuda:0..N-1 of the GPUs the job was given."""
    spec = parse_spec({"distributed": {"strategy": "deepspeed", "max_restarts": 2}, "resources": {"gpus_per_node": 2}})
    base = {"OMP_PROC_BIND": "close"} | ({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    host = Host(cuda_devices=cuda_devices, cores=4, env={**base, "SECRET": "x"}, python="/py")
    cmd = local_command(spec, host, config_path="/r.json", data_dir="/d", run_dir="/r")
    assert cmd.argv == torchrun_argv(2, "/r.json", max_restarts=2, python="/py")
    assert cmd.env == deepspeed_env(2, base, cuda=cuda_devices > 0, cores=4)  # a cpu job, no cpu slots named
    assert cmd.env.get("CUDA_VISIBLE_DEVICES") == visible


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
