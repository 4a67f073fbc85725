import sys

import pytest

from trainyard.training.launchers.local import LaunchError, run, torchrun_argv, worker_env


@pytest.mark.parametrize(
    "nproc, expected",
    [
        (1, ["--standalone", "--nnodes=1", "--nproc_per_node=1"]),
        (4, ["--standalone", "--nnodes=1", "--nproc_per_node=4"]),
    ],
)
def test_torchrun_argv(nproc, expected):
    argv = torchrun_argv(nproc, "/x/run config.json", python="/py")
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert argv[3:6] == expected
    assert argv[-2:] == ["--config", "/x/run config.json"]  # one argv item, never shell-split


def test_nproc_must_be_positive():
    with pytest.raises(ValueError):
        torchrun_argv(0, "c.json")


def test_worker_env_limits_threads():
    assert worker_env(2, base={})["OMP_NUM_THREADS"].isdigit()
    assert worker_env(2, base={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"


def test_run_streams_lines_and_reports_failure():
    lines = []
    run([sys.executable, "-c", "print('a'); print('b')"], on_line=lines.append)
    assert lines == ["a", "b"]
    with pytest.raises(LaunchError, match="exited with 3; last lines:\nboom"):
        run([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], on_line=lambda _: None)
