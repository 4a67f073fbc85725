import sys
from pathlib import Path

import pytest

from trainyard.spec import parse_spec
from trainyard.training.launchers.command import Host, local_command
from trainyard.training.launchers.horovod import horovodrun_argv, horovodrun_bin


@pytest.mark.parametrize(
    "nproc, config, python, expected",
    [
        (
            1,
            "c.json",
            "/venv/bin/python",
            [
                "/venv/bin/horovodrun",
                "-np",
                "1",
                "-H",
                "localhost:1",
                "--gloo",
                "/venv/bin/python",
                "-m",
                "trainyard.training.entry",
                "--config",
                "c.json",
            ],
        ),
        (
            2,
            "/runs/a b/run.json",
            "/opt/py/bin/python3.11",
            [
                "/opt/py/bin/horovodrun",
                "-np",
                "2",
                "-H",
                "localhost:2",
                "--gloo",
                "/opt/py/bin/python3.11",
                "-m",
                "trainyard.training.entry",
                "--config",
                "/runs/a b/run.json",
            ],
        ),
        (
            8,
            "x.json",
            "/p/python",
            [
                "/p/horovodrun",
                "-np",
                "8",
                "-H",
                "localhost:8",
                "--gloo",
                "/p/python",
                "-m",
                "trainyard.training.entry",
                "--config",
                "x.json",
            ],
        ),
    ],
)
def test_horovodrun_argv(nproc, config, python, expected):
    assert horovodrun_argv(nproc, config, python=python) == expected


def test_defaults_to_this_interpreter_and_its_horovodrun():
    argv = horovodrun_argv(2, "c.json")
    assert argv[0] == str(Path(sys.executable).parent / "horovodrun") == horovodrun_bin()
    assert argv[6] == sys.executable


@pytest.mark.parametrize("nproc", [0, -1])
def test_nproc_must_be_positive(nproc):
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        horovodrun_argv(nproc, "c.json")


def test_local_launcher_dispatches_horovod():
    spec = parse_spec({"distributed": {"strategy": "horovod", "max_restarts": 1}, "resources": {"gpus_per_node": 3}})
    cmd = local_command(spec, Host(cuda_devices=0, cores=3), config_path="run.json", data_dir="/d", run_dir="/r")
    assert cmd.argv == horovodrun_argv(3, "run.json")
