"""The one worker loop in this process (ddp strategy, a world of one): the result record, a metric point
per tracking.log_every_steps window kept without a per-step sync, checkpoints and resume, and
distributed.precision honoured."""

import json
import math

import pytest
import torch

from trainyard.pipeline import RESULT_FIELDS
from trainyard.spec import parse_spec
from trainyard.training import strategies
from trainyard.training.loop import train, window_ends
from trainyard.training.run_config import RunConfig


@pytest.fixture(autouse=True)
def world_of_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TRAINYARD_FAIL_ONCE_AT_STEP"):
        monkeypatch.delenv(var, raising=False)


def _cfg(tmp_path, prepared, **spec) -> RunConfig:
    raw = {"hyperparameters": {"epochs": 2, "batch_size": 64, "learning_rate": 0.1, "seed": 5}, **spec}
    return RunConfig(spec=parse_spec(raw), data=prepared, out_dir=str(tmp_path), tensorboard_dir=str(tmp_path / "tb"))


def _scalars(tb_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_trains_records_every_step_and_resumes(tmp_path, prepared, capsys):
    cfg = _cfg(tmp_path, prepared, tracking={"log_every_steps": 10})  # windows inside the 23-step epochs
    result = train(cfg, strategies.for_run(cfg))
    steps = result["steps"]
    per_epoch = int(capsys.readouterr().out.split("steps/epoch=")[1].split()[0])
    assert steps == 2 * per_epoch
    assert set(result) >= RESULT_FIELDS | {"model_path", "val_accuracy"}  # every field the pipeline keeps
    assert (result["strategy"], result["world_size"], result["resumed_from_step"]) == ("ddp", 1, None)
    assert json.loads((tmp_path / "train_result.json").read_text()) == result
    import gc

    assert gc.get_freeze_count() == 0  # the heap frozen for the loop is collectable again after it
    # One point per tracking.log_every_steps window, cut at each epoch's end.
    points = [s for s in range(1, steps + 1) if s % 10 == 0 or s % per_epoch == 0]
    assert window_ends(steps, per_epoch, 10) == points
    assert [s for s, _ in _scalars(tmp_path / "tb", "train/loss")] == points
    assert [s for s, _ in _scalars(tmp_path / "tb", "train/lr")] == points
    norms = [s for s, _ in _scalars(tmp_path / "tb", "train/grad_norm")]
    assert norms == list(range(10, steps + 1, 10))
    epochs = _scalars(tmp_path / "tb", "epoch/seconds")  # each whole epoch's wall time, at its last step
    assert [s for s, _ in epochs] == [per_epoch, steps]
    assert all(v > 0 for _, v in epochs) and sum(v for _, v in epochs) <= result["loop_seconds"] + 1e-3
    ckpts = sorted(p.name for p in cfg.checkpoint_dir.glob("step-*.pt"))
    assert ckpts == [f"step-{steps // 2:08d}.pt", f"step-{steps:08d}.pt"]  # one per epoch

    again = train(cfg, strategies.for_run(cfg))  # a retry of a finished run resumes at its end
    assert again["resumed_from_step"] == steps == again["steps"]
    assert f"resumed from checkpoint step-{steps:08d}.pt at step {steps}" in capsys.readouterr().out


def test_bf16_runs_the_forward_in_bf16_and_saves_fp32(tmp_path, prepared):
    seen = set()
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: (
            seen.add(out.dtype) if isinstance(module, torch.nn.Conv2d) and module.training else None
        )
    )
    try:
        cfg = _cfg(tmp_path, prepared, distributed={"precision": "bf16"})
        result = train(cfg, strategies.for_run(cfg))
    finally:
        hook.remove()
    assert seen == {torch.bfloat16}
    blob = torch.load(result["model_path"], weights_only=True)
    assert {t.dtype for t in blob["state_dict"].values()} == {torch.float32}
    assert result["val_accuracy"] > 0.5


def test_fp16_on_cpu_is_refused_naming_the_field(tmp_path, prepared):
    from trainyard.training.strategies.precision import PrecisionError

    cfg = _cfg(tmp_path, prepared, distributed={"precision": "fp16"})
    with pytest.raises(PrecisionError, match="distributed.precision 'fp16' needs CUDA GPUs"):
        train(cfg, strategies.for_run(cfg))
    _no_tracker_left()


def _no_tracker_left():
    import threading

    assert not [t for t in threading.enumerate() if t.name == "trainyard-tracker"]  # closed on the way out


def test_a_try_resumed_mid_epoch_times_only_its_whole_epochs(tmp_path, prepared):
    cfg = _cfg(tmp_path, prepared, checkpointing={"every_steps": 30})  # 23 steps an epoch: one checkpoint
    assert train(cfg, strategies.for_run(cfg))["steps"] == 46
    retry = RunConfig(spec=cfg.spec, data=prepared, out_dir=cfg.out_dir, tensorboard_dir=str(tmp_path / "tb2"))
    assert train(retry, strategies.for_run(retry))["resumed_from_step"] == 30  # the rest of epoch 2 only
    assert [s for s, _ in _scalars(tmp_path / "tb2", "epoch")] == [46]
    with pytest.raises(KeyError, match="epoch/seconds"):  # none for the rest of an epoch: not a fast epoch
        _scalars(tmp_path / "tb2", "epoch/seconds")


def test_a_checkpoint_of_two_workers_resumes_on_one_by_samples_with_half_the_learning_rate(tmp_path, prepared, capsys):
    """What an elastic training does after losing a node: the step-30 checkpoint, as two workers would
    have written it (7 batches of 64 each into epoch 2), resumed by one: the 896 samples done are skipped
    (14 of its batches), its 9 batches left are trained, the learning rate is halved with the global batch,
    and the cosine schedule ends with them."""
    cfg = _cfg(tmp_path, prepared, checkpointing={"every_steps": 30}, tracking={"log_every_steps": 1})
    assert train(cfg, strategies.for_run(cfg))["steps"] == 46
    path = cfg.checkpoint_dir / "step-00000030.pt"
    state = torch.load(path, weights_only=True)
    assert (state["epoch"], state["batches_done"], state["world"]) == (1, 7, 1)
    torch.save({**state, "world": 2}, path)
    capsys.readouterr()
    retry = RunConfig(spec=cfg.spec, data=prepared, out_dir=cfg.out_dir, tensorboard_dir=str(tmp_path / "tb2"))
    result = train(retry, strategies.for_run(retry))
    out = capsys.readouterr().out
    assert "resuming on 1 worker(s) what 2 trained: 896 of the epoch's" in out and "0 of them are trained again" in out
    assert "at step 30 (epoch 2, batch 14)" in out
    assert (result["resumed_from_step"], result["steps"]) == (30, 39)
    assert "2 -> 1 worker(s): the learning rate follows the global batch (64 x 1), x 0.5" in out
    rates = _scalars(tmp_path / "tb2", "train/lr")
    at_30 = 0.1 * (1 + math.cos(math.pi * 30 / 46)) / 2  # where the two workers' schedule was
    assert rates[0][0] == 31 and rates[0][1] == pytest.approx(at_30 / 2, rel=1e-4)
    assert rates[-1][0] == 39 and rates[-1][1] < 0.01 * 0.1  # near the end of the cosine, as the run ends
    assert all(b <= a for (_, a), (_, b) in zip(rates, rates[1:], strict=False))


def test_an_elastic_job_started_short_of_its_nodes_scales_its_learning_rate_to_them(tmp_path, prepared, capsys):
    """learning_rate is for the job's full size (2 nodes x 1 worker): begun by one worker (its other node not
    there yet), the rate is halved, as it would be after losing that node."""
    elastic = {
        "resources": {"nodes": 2, "min_nodes": 1, "gpus_per_node": 1},
        "backends": {"launcher": "kubernetes"},
        "tracking": {"log_every_steps": 1},
    }
    cfg = _cfg(tmp_path, prepared, **elastic)
    train(cfg, strategies.for_run(cfg))
    assert (
        "started on 1 of 2 workers: the learning rate follows the global batch (64 x 1), x 0.5"
        in capsys.readouterr().out
    )
    rates = _scalars(tmp_path / "tb", "train/lr")
    assert rates[0] == (1, pytest.approx(0.05))


def test_every_step_is_a_point_when_asked(tmp_path, prepared):
    cfg = _cfg(tmp_path, prepared, tracking={"log_every_steps": 1})
    steps = train(cfg, strategies.for_run(cfg))["steps"]
    assert [s for s, _ in _scalars(tmp_path / "tb", "train/loss")] == list(range(1, steps + 1))


def test_tracking_that_cannot_start_fails_the_run_before_it_trains(tmp_path, prepared):
    from trainyard.training.tracking import TrackingError

    (tmp_path / "not-a-dir").write_text("")
    cfg = _cfg(tmp_path, prepared)
    cfg = RunConfig(
        spec=cfg.spec, data=prepared, out_dir=str(tmp_path), tensorboard_dir=str(tmp_path / "not-a-dir" / "tb")
    )
    with pytest.raises(TrackingError, match="metrics were lost"):
        train(cfg, strategies.for_run(cfg))
    assert not list(cfg.checkpoint_dir.glob("step-*.pt"))  # not one step was trained
    _no_tracker_left()


def test_compile_trains_through_torch_compile_and_saves_the_plain_model(tmp_path, prepared, capsys):
    cfg = _cfg(tmp_path, prepared, distributed={"compile": True})
    compiled = []
    real_compile = torch.compile

    def spy(module, *args, **kwargs):
        compiled.append(type(module).__name__)
        return real_compile(module, *args, **kwargs)

    torch.compile = spy
    try:
        result = train(cfg, strategies.for_run(cfg))
    finally:
        torch.compile = real_compile
    assert compiled == ["SmallCNN"]
    assert "compile=torch.compile" in capsys.readouterr().out
    blob = torch.load(result["model_path"], weights_only=True)
    assert not [k for k in blob["state_dict"] if k.startswith("_orig_mod")]  # the plain module's weights
    assert result["val_accuracy"] > 0.5


def test_compile_is_refused_for_deepspeed_naming_the_way_out():
    from trainyard.spec import SpecError

    with pytest.raises(SpecError, match="use strategy ddp or horovod to compile"):
        parse_spec({"distributed": {"strategy": "deepspeed", "compile": True}})
