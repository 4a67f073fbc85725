"""The DeepSpeed config for a JobSpec: one pure function, so what a run trains with is visible in a test.

The JobSpec is the source of truth: ``hyperparameters`` give the batch size and the optimizer (SGD or AdamW),
``distributed.zero_stage`` the ZeRO stage and ``distributed.precision`` the bf16/fp16 block. The learning
rate schedule is not in here: the trainer hands DeepSpeed the same torch cosine schedule the DDP loop
uses (its state is saved in DeepSpeed's checkpoints like the optimizer's).
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16")

# DeepSpeed prints a throughput line every ``steps_per_print`` steps; the trainer logs its own.
QUIET_STEPS = 1_000_000_000


def _optimizer(hp: dict) -> dict:
    """``hyperparameters.optimizer`` as DeepSpeed's optimizer block: the same torch optimizers the DDP loop
    builds (``torch_adam``: torch.optim.AdamW rather than DeepSpeed's compiled CPU/fused Adam kernels)."""
    lr, wd = float(hp["learning_rate"]), float(hp.get("weight_decay", 0.0))
    if hp.get("optimizer", "sgd") == "adamw":
        return {"type": "AdamW", "params": {"lr": lr, "weight_decay": wd, "torch_adam": True}}
    # not a DeepSpeed optimizer: DeepSpeed builds torch.optim.SGD from these params
    return {"type": "SGD", "params": {"lr": lr, "momentum": float(hp.get("momentum", 0.0)), "weight_decay": wd}}


def deepspeed_config(spec: dict, world_size: int, *, cuda: bool = False) -> dict:
    """The ``config`` for ``deepspeed.initialize`` for a validated JobSpec dict and ``world_size`` processes.

    ``cuda`` says whether the workers train on CUDA GPUs; fp16 (dynamic loss scaling) is CUDA-only, so on
    CPU it is refused here, with the field to change, before any process starts.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    hp = spec["hyperparameters"]
    dist = spec.get("distributed", {})
    stage = int(dist.get("zero_stage", 1))
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"distributed.zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    precision = dist.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise ValueError(f"distributed.precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp16" and not cuda:
        raise ValueError(
            "distributed.precision 'fp16' needs CUDA GPUs (DeepSpeed's CPU accelerator has no fp16: "
            "'Type fp16 is not supported on your device'); use 'bf16' or 'fp32' for CPU workers"
        )

    micro = int(hp["batch_size"])
    config: dict = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * world_size,
        "optimizer": _optimizer(hp),
        # ZeRO only vouches for its own optimizers; plain SGD is fine for stages 1-3 (checked in the tests).
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        # 0 = no clipping, like the DDP loop. Not a JobSpec field (yet); a hyperparameter if one appears.
        "gradient_clipping": float(hp.get("gradient_clipping", 0.0)),
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config
