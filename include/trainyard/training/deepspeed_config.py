"""The DeepSpeed config for a JobSpec: one pure function, so what a run trains with is visible in a test.

The JobSpec is the source of truth: ``hyperparameters`` give the batch size and the optimizer (SGD or AdamW),
``distributed.zero_stage`` the ZeRO stage and ``distributed.precision`` the bf16/fp16 block. The learning
rate schedule is not in here: the DeepSpeed strategy hands DeepSpeed the same torch cosine schedule the
other strategies use (its state is saved in DeepSpeed's checkpoints like the optimizer's). There is no
gradient clipping, as in the other strategies (0.0 = off).
"""

from __future__ import annotations

from trainyard.spec import Hyperparameters, JobSpec
from trainyard.training.strategies.precision import check_precision

# DeepSpeed prints a throughput line every ``steps_per_print`` steps; the trainer logs its own.
QUIET_STEPS = 1_000_000_000


def _optimizer(hp: Hyperparameters) -> dict:
    """``hyperparameters.optimizer`` as DeepSpeed's optimizer block: the same torch optimizers
    :func:`trainyard.training.common.make_optimizer` builds (``torch_adam``: torch.optim.AdamW rather than
    DeepSpeed's compiled CPU/fused Adam kernels)."""
    if hp.optimizer == "adamw":
        params = {"lr": hp.learning_rate, "weight_decay": hp.weight_decay, "torch_adam": True}
        return {"type": "AdamW", "params": params}
    # not a DeepSpeed optimizer: DeepSpeed builds torch.optim.SGD from these params
    return {"type": "SGD", "params": {"lr": hp.learning_rate, "momentum": hp.momentum, "weight_decay": hp.weight_decay}}


def deepspeed_config(spec: JobSpec, world_size: int, *, cuda: bool = False) -> dict:
    """The ``config`` for ``deepspeed.initialize`` for a JobSpec and ``world_size`` processes.

    ``cuda`` says whether the workers train on CUDA GPUs; fp16 is CUDA-only, so on CPU it is refused here
    (:func:`check_precision`), with the field to change.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    check_precision(spec, cuda)
    hp, precision = spec.hyperparameters, spec.distributed.precision
    config: dict = {
        "train_micro_batch_size_per_gpu": hp.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": hp.batch_size * world_size,
        "optimizer": _optimizer(hp),
        # ZeRO only vouches for its own optimizers; plain SGD is fine for stages 1-3 (checked in the tests).
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": spec.distributed.zero_stage},
        "gradient_clipping": 0.0,
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config
