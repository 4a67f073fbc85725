"""deepspeed_config(): the DeepSpeed config made from a JobSpec."""

import pytest

from trainyard.spec import JobSpec, parse_spec
from trainyard.training.deepspeed_config import QUIET_STEPS, deepspeed_config
from trainyard.training.strategies.precision import PrecisionError


def _spec(stage=1, precision="fp32", batch=32, lr=0.1, momentum=0.9) -> JobSpec:
    raw = {
        "hyperparameters": {"batch_size": batch, "learning_rate": lr, "momentum": momentum},
        "distributed": {"strategy": "deepspeed", "zero_stage": stage, "precision": precision},
    }
    return parse_spec(raw)


@pytest.mark.parametrize(
    "stage, precision, world, cuda, micro, train_batch, blocks",
    [
        (0, "fp32", 1, False, 32, 32, {}),
        (1, "fp32", 2, False, 32, 64, {}),
        (2, "fp32", 4, False, 32, 128, {}),
        (3, "fp32", 8, False, 32, 256, {}),
        (1, "bf16", 2, False, 32, 64, {"bf16": {"enabled": True}}),
        (2, "bf16", 3, True, 32, 96, {"bf16": {"enabled": True}}),
        (3, "bf16", 2, False, 32, 64, {"bf16": {"enabled": True}}),
        (2, "fp16", 2, True, 32, 64, {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}),
        (0, "fp16", 1, True, 32, 32, {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}),
    ],
)
def test_config_table(stage, precision, world, cuda, micro, train_batch, blocks):
    cfg = deepspeed_config(_spec(stage, precision), world, cuda=cuda)
    assert cfg["train_micro_batch_size_per_gpu"] == micro
    assert cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == train_batch == micro * world  # DeepSpeed checks this identity
    assert cfg["zero_optimization"] == {"stage": stage}
    for name in ("bf16", "fp16"):
        assert cfg.get(name) == blocks.get(name)


@pytest.mark.parametrize("batch, lr, momentum", [(32, 0.1, 0.9), (8, 0.05, 0.0), (512, 1.0, 0.5)])
def test_optimizer_from_hyperparameters(batch, lr, momentum):
    cfg = deepspeed_config(_spec(batch=batch, lr=lr, momentum=momentum), 2)
    assert cfg["optimizer"] == {"type": "SGD", "params": {"lr": lr, "momentum": momentum, "weight_decay": 0.0}}
    assert cfg["zero_allow_untested_optimizer"] is True  # SGD is not one of ZeRO's own optimizers
    assert cfg["train_micro_batch_size_per_gpu"] == batch and cfg["train_batch_size"] == 2 * batch


def test_adamw_is_torch_adamw():
    raw = {"hyperparameters": {"optimizer": "adamw", "learning_rate": 0.003, "weight_decay": 0.01}}
    cfg = deepspeed_config(parse_spec(raw), 2)
    # torch_adam: DeepSpeed builds torch.optim.AdamW, not its compiled cpu_adam/fused kernels (no build on CPU)
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01, "torch_adam": True}}


def test_quiet_and_unclipped():
    cfg = deepspeed_config(_spec(), 2)
    assert cfg["steps_per_print"] == QUIET_STEPS >= 10**9
    assert cfg["wall_clock_breakdown"] is False
    assert cfg["gradient_clipping"] == 0.0  # like the torch strategies; not a JobSpec field


def test_momentum_is_the_specs_default():
    """A spec that names no momentum trains with the JobSpec's default (0.9), not a second default."""
    cfg = deepspeed_config(parse_spec({"distributed": {"strategy": "deepspeed"}}), 2)
    assert cfg["optimizer"]["params"]["momentum"] == JobSpec().hyperparameters.momentum == 0.9


def test_defaults_of_a_minimal_spec():
    """The JobSpec's defaults: ZeRO stage 1, fp32."""
    cfg = deepspeed_config(parse_spec({"distributed": {"strategy": "deepspeed"}}), 2)
    assert cfg["zero_optimization"]["stage"] == 1 and "bf16" not in cfg and "fp16" not in cfg


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp16_is_refused_on_cpu(stage):
    with pytest.raises(PrecisionError, match=r"distributed\.precision 'fp16' needs CUDA GPUs.*'fp32' or 'bf16'"):
        deepspeed_config(_spec(stage, "fp16"), 2)  # cuda defaults to False
    with pytest.raises(ValueError, match="distributed.precision"):
        deepspeed_config(_spec(stage, "fp16"), 2, cuda=False)


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        deepspeed_config(_spec(), 0)


def test_pure():
    spec = _spec(2, "bf16")
    before = repr(spec)
    assert deepspeed_config(spec, 2) == deepspeed_config(spec, 2)
    assert repr(spec) == before
