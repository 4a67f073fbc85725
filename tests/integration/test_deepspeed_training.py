"""distributed.strategy deepspeed: 2 CPU processes under torchrun (gloo, ZeRO-2) on the prepared digits data:
training, DeepSpeed checkpoints, a crash, and a resume past a damaged checkpoint. ZeRO-0/1 training is
held to DDP's loss curve in test_strategy_golden."""

import json
import os
import subprocess
import sys

import pytest

from trainyard.training.run_config import RunConfig

pytestmark = pytest.mark.integration

LIMIT_S = 900  # a hung collective fails the test instead of hanging the suite (2 test workers share the cores)


@pytest.fixture(scope="module", autouse=True)
def deepspeed_installed():
    probe = subprocess.run(
        [sys.executable, "-c", "import deepspeed"],
        capture_output=True,
        text=True,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    if probe.returncode != 0:
        pytest.fail(
            f"deepspeed cannot be imported in this venv (pip install deepspeed==0.19.8):\n{probe.stderr[-2000:]}"
        )


def _config(tmp_path, small_spec, prepared, nproc=2, **distributed) -> str:
    from trainyard.spec import parse_spec

    raw = dict(small_spec, distributed={"strategy": "deepspeed", **distributed}, resources={"gpus_per_node": nproc})
    spec = parse_spec(raw)
    out = tmp_path / "run"
    out.mkdir()
    cfg = RunConfig(spec=spec, data=prepared, out_dir=str(out), tracking_uri=None)
    return str(cfg.dump(out / "run_config.json"))


def _run(argv, env, lines: list[str] | None = None) -> list[str]:
    from trainyard.training.launchers.local import run

    lines = [] if lines is None else lines
    run(["timeout", "-k", "10", str(LIMIT_S), *argv], env=env, on_line=lines.append)
    return lines


def _train(config_path: str, lines: list[str] | None = None, **env) -> list[str]:
    """The command production runs (launchers.command.local_command), with ``env`` added."""
    import dataclasses

    from trainyard.training.launchers.command import local_command
    from trainyard.training.launchers.local import this_host

    cfg = RunConfig.load(config_path)
    host = dataclasses.replace(this_host(), env={**os.environ, **env})
    command = local_command(cfg.spec, host, config_path=config_path, data_dir=cfg.data.path, run_dir=cfg.out_dir)
    return _run(command.argv, command.env, lines)


def _has(lines, text) -> bool:
    return any(text in line for line in lines)


def test_zero2_trains_and_resumes_past_a_damaged_checkpoint(tmp_path, small_spec, prepared):
    """A worker dies in epoch 3 (checkpoints of epochs 1 and 2 written; no torchrun restart), the newest
    checkpoint is then damaged; the retry skips it, resumes at the epoch-1 checkpoint and trains to the end."""
    from trainyard.recipes import load_model
    from trainyard.training.launchers.local import LaunchError
    from trainyard.training.strategies.deepspeed import MARKER

    stage = 2
    config = _config(tmp_path, small_spec, prepared, zero_stage=stage, max_restarts=0)
    out = RunConfig.load(config)
    run_dir = out.checkpoint_dir.parent
    crash_lines: list[str] = []
    with pytest.raises(LaunchError):  # the launcher ends the surviving rank and fails (no hang)
        _train(config, crash_lines, TRAINYARD_FAIL_ONCE_AT_STEP="50")  # 1461 / 2 ranks / 32 = 23 steps/epoch
    assert _has(crash_lines, "fault injection: crashing at step 50"), "\n".join(crash_lines)
    assert not (run_dir / "train_result.json").exists()
    tags = sorted(p.name for p in out.checkpoint_dir.glob("step-*"))
    assert tags == ["step-00000023", "step-00000046"], tags
    assert all((out.checkpoint_dir / t / MARKER).is_file() for t in tags)
    # DeepSpeed's own layout: model states plus one ZeRO optimizer partition per rank.
    partitions = sorted(p.name for p in (out.checkpoint_dir / "step-00000046").glob("*optim_states.pt"))
    assert partitions == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)], partitions
    part = out.checkpoint_dir / "step-00000046" / partitions[1]
    part.write_bytes(part.read_bytes()[:100])  # rank 1's partition cut short

    lines = _train(config, TRAINYARD_FAIL_ONCE_AT_STEP="50")  # the marker file makes the fault fire once
    log = "\n".join(lines)
    assert _has(lines, f"strategy=deepspeed world_size=2 zero_stage={stage} precision=fp32 backend=gloo"), log
    assert _has(lines, f"checkpoint step-00000046 is unusable ({partitions[1]} is 100 bytes"), log
    assert _has(lines, "resumed from checkpoint step-00000023 at step 23 (epoch 2, batch 0)"), log
    result = json.loads((run_dir / "train_result.json").read_text())
    assert result["strategy"] == "deepspeed" and result["world_size"] == 2 and result["epochs"] == 4
    assert result["steps"] == 92 and result["val_accuracy"] > 0.8, result
    tags = sorted(p.name for p in out.checkpoint_dir.glob("step-*"))
    assert tags == ["step-00000046", "step-00000069", "step-00000092"], tags  # keep_last 3; 46 rewritten
    assert all((out.checkpoint_dir / t / MARKER).is_file() for t in tags)
    model = load_model(result["model_path"])  # a plain fp32 SmallCNN, whatever DeepSpeed trained with
    assert all(p.dtype.is_floating_point and p.dtype.itemsize == 4 for p in model.parameters())


def test_zero3_bf16_as_a_single_process(tmp_path, small_spec, prepared):
    """Without a launcher (world of one), ZeRO-3 and bf16 on CPU; model.pt is still fp32."""
    import torch

    from trainyard.recipes import load_model

    small_spec["hyperparameters"]["epochs"] = 2
    config = _config(tmp_path, small_spec, prepared, nproc=1, zero_stage=3, precision="bf16")
    from trainyard.training.launchers.deepspeed import deepspeed_env

    lines = _run([sys.executable, "-m", "trainyard.training.entry", "--config", config], deepspeed_env(1, os.environ))
    log = "\n".join(lines)
    assert _has(lines, "strategy=deepspeed world_size=1 zero_stage=3 precision=bf16"), log
    out = RunConfig.load(config)
    result = json.loads((out.checkpoint_dir.parent / "train_result.json").read_text())
    assert result["steps"] == 2 * 46 and result["val_accuracy"] > 0.8, result
    assert sorted(p.name for p in out.checkpoint_dir.glob("step-*")) == ["step-00000046", "step-00000092"]
    assert {p.dtype for p in load_model(result["model_path"]).parameters()} == {torch.float32}
