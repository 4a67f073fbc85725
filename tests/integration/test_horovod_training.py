"""distributed.strategy horovod: real horovodrun (Gloo) with 2 workers on the prepared digits data."""

import functools
import json
import os
import subprocess
import sys

import pytest

from trainyard.training.run_config import RunConfig

pytestmark = pytest.mark.integration


@functools.cache
def _horovod_import_error() -> str | None:
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True)
    return None if probe.returncode == 0 else probe.stderr[-2000:]


def _require_horovod() -> None:
    """Not a skip: `make test` builds Horovod, so a missing one is a broken set-up and must fail."""
    err = _horovod_import_error()
    if err is not None:
        pytest.fail(
            "horovod.torch cannot be imported in this venv; build it with scripts/build_horovod.sh "
            f"(`make setup` runs it):\n{err}"
        )


def _config(tmp_path, small_spec, prepared) -> str:
    from trainyard.spec import parse_spec

    raw = dict(small_spec, distributed={"strategy": "horovod"}, resources={"gpus_per_node": 2})
    spec = parse_spec(raw)
    out = tmp_path / "run"
    out.mkdir()
    cfg = RunConfig(spec=spec, data=prepared, out_dir=str(out), tracking_uri=None)
    return str(cfg.dump(out / "run_config.json"))


def _train(config_path: str, **env) -> list[str]:
    """The command production runs (launchers.command.local_command), with ``env`` added."""
    import dataclasses

    from trainyard.training.launchers.command import local_command
    from trainyard.training.launchers.local import run, this_host

    _require_horovod()
    cfg = RunConfig.load(config_path)
    host = dataclasses.replace(this_host(), env={**os.environ, **env})
    command = local_command(cfg.spec, host, config_path=config_path, data_dir=cfg.data.path, run_dir=cfg.out_dir)
    lines: list[str] = []
    run(command.argv, env=command.env, on_line=lines.append)
    return lines


def _has(lines, text) -> bool:
    return any(text in line for line in lines)


def test_trains_crashes_and_resumes(tmp_path, small_spec, prepared):
    """A worker dies hard in epoch 2: horovodrun fails (no hang); the retry resumes at the epoch-1
    checkpoint and trains to the end, checkpointing every epoch (keep_last 3)."""
    from trainyard.training.launchers.local import LaunchError

    config = _config(tmp_path, small_spec, prepared)
    out = RunConfig.load(config)
    with pytest.raises(LaunchError):
        _train(config, TRAINYARD_FAIL_ONCE_AT_STEP="30")
    assert not (out.checkpoint_dir.parent / "train_result.json").exists()
    (first,) = [p.name for p in out.checkpoint_dir.glob("step-*.pt")]
    lines = _train(config, TRAINYARD_FAIL_ONCE_AT_STEP="30")  # the marker makes the fault fire once
    log = "\n".join(lines)
    assert _has(lines, "strategy=horovod world_size=2"), log
    step = int(first[5:13])
    assert _has(lines, f"resumed from checkpoint {first} at step {step} (epoch 2, batch 0)"), log
    result = json.loads((out.checkpoint_dir.parent / "train_result.json").read_text())
    assert result["strategy"] == "horovod" and result["world_size"] == 2 and result["epochs"] == 4
    assert result["steps"] == 4 * step and result["val_accuracy"] > 0.8, result
    assert (out.checkpoint_dir.parent / "model.pt").is_file()
    ckpts = sorted(p.name for p in out.checkpoint_dir.glob("step-*.pt"))
    assert ckpts == [f"step-{k * step:08d}.pt" for k in (2, 3, 4)], ckpts
