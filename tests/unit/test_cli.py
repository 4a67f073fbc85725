"""The ``trainyard`` command as a user runs it (a subprocess): errors are one line, tracebacks only on --debug."""

import os
import subprocess
import sys

import pytest

from trainyard.errors import EXIT_ERROR


@pytest.fixture
def run(tmp_path):
    env = dict(os.environ, TRAINYARD_HOME=str(tmp_path / "home"))

    def run(*argv):
        return subprocess.run(
            [sys.executable, "-m", "trainyard.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )

    return run


def one_error_line(result) -> str:
    assert result.returncode == EXIT_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trainyard: error: ")
    return lines[0]


def test_missing_repository_is_one_line_that_says_what_to_do(run):
    line = one_error_line(run("data", "log", "--repo", "nope"))
    assert "repository 'nope' does not exist" in line
    assert "trainyard data upload <folder> --store local --repo nope" in line


def test_debug_shows_the_traceback_and_the_same_line(run):
    result = run("--debug", "data", "log", "--repo", "nope")
    assert result.returncode == EXIT_ERROR
    assert "Traceback (most recent call last)" in result.stderr
    assert "trainyard.data.store.NotFound" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("trainyard: error: repository 'nope' does not exist")


def test_missing_job_file_is_one_line(run):
    line = one_error_line(run("validate", "no-such-job.yaml"))
    assert "no-such-job.yaml" in line


def test_registry_command_errors_are_one_line_too(run, tmp_path):
    keys = str(tmp_path / "keys")
    assert run("models", "keygen", "--dir", keys).returncode == 0
    line = one_error_line(run("models", "keygen", "--dir", keys))
    assert "refusing to overwrite" in line and "--if-missing" in line


def test_exit_statuses_are_documented_in_help(run):
    assert run("data", "log").returncode == 2  # argparse: --repo is required
    help_text = " ".join(run("--help").stdout.split())
    assert f"{EXIT_ERROR} on an error, reported as one line" in help_text and "2 when the command line" in help_text
    assert "--debug" in help_text


def test_validate_checks_a_file_and_writes_nothing(run, tmp_path):
    """A check is not an act: neither a spec that passes nor one its team's policy refuses leaves an audit
    entry, a ledger or anything else under TRAINYARD_HOME."""
    import yaml

    good, refused = tmp_path / "good.yaml", tmp_path / "refused.yaml"
    good.write_text(yaml.safe_dump({"name": "ok", "resources": {"gpus_per_node": 1, "gpu_type": "cpu"}}))
    custom = {"command": ["python", "train.py"]}
    refused.write_text(yaml.safe_dump({"recipe": "custom", "custom": custom, "resources": {"team": "vision"}}))
    assert run("validate", str(good)).returncode == 0
    done = run("validate", str(refused))
    assert done.returncode == EXIT_ERROR and "policy.custom_commands is false" in done.stderr
    home = tmp_path / "home"
    assert not home.exists() or [p for p in home.rglob("*") if p.is_file()] == []
