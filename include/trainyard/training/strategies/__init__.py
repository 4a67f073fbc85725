"""One class per ``distributed.strategy``, behind :class:`trainyard.training.strategies.base.Strategy`."""

from __future__ import annotations

import importlib

from trainyard.training.run_config import RunConfig

STRATEGIES = {
    "ddp": "trainyard.training.strategies.ddp:DDPStrategy",
    "horovod": "trainyard.training.strategies.horovod:HorovodStrategy",
    "deepspeed": "trainyard.training.strategies.deepspeed:DeepSpeedStrategy",
}


def for_run(cfg: RunConfig):
    """The strategy object of the run's ``distributed.strategy`` (imported on demand: each pulls in its
    own framework)."""
    module, cls = STRATEGIES[cfg.spec.distributed.strategy].split(":")
    return getattr(importlib.import_module(module), cls)(cfg)
