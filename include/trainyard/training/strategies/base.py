"""The strategy seam of the one worker loop (:mod:`trainyard.training.loop`).

A strategy owns what differs between ddp, horovod and deepspeed inside a worker: starting the process
group (the device first, on GPUs), wrapping the model and optimizer, one optimisation step (backward,
gradient averaging, optimizer and schedule step), averaging a tensor over the workers, the barrier,
checkpoint save / load, the fp32 model for ``model.pt``, and shutting down. The loop owns everything else
(data, schedule of checkpoints and logging, the result record), so the strategies cannot drift apart.

:class:`TorchStrategy` is the part ddp and horovod share: a plain torch optimizer and cosine schedule,
autocast / grad scaler for ``distributed.precision``, and the atomic torch checkpoint files of
:class:`trainyard.training.common.Checkpoints` written by rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist

from trainyard.errors import PermanentError
from trainyard.training.common import Checkpoints, log0, make_optimizer, make_scheduler
from trainyard.training.run_config import RunConfig
from trainyard.training.strategies import precision as amp


def total_norm(model: torch.nn.Module) -> torch.Tensor:
    """The global L2 norm of the gradients, left on the device (no host sync)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def start_all_reduce_mean(t: torch.Tensor, world: int) -> Callable[[], torch.Tensor]:
    """:meth:`Strategy.start_mean` over torch.distributed's default group (none: a world of one)."""
    if not dist.is_initialized():
        return lambda: t
    t = t.detach().clone()
    if t.device.type != "cpu":  # NCCL: a blocking call only queues it on the stream (the host does not
        dist.all_reduce(t)  # wait), and one in flight beside DeepSpeed's own communicator's could deadlock
        return lambda: t / world
    work = dist.all_reduce(t, async_op=True)  # gloo: runs on its threads beside the next steps; SUM, no AVG

    def mean() -> torch.Tensor:
        work.wait()
        return t / world

    return mean


def cuda_device(local_rank: int) -> torch.device:
    """This worker's GPU, made current before any process group exists (NCCL binds to the current device)."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise PermanentError(
            f"worker with LOCAL_RANK {local_rank} found {count} CUDA device(s): resources.gpus_per_node must "
            f"be at most {count} on this machine"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


class Strategy:
    """One distributed strategy inside a worker. ``init`` comes first; after ``prepare`` the loop reads
    ``model`` (the plain module), ``forward`` (what the loss runs through) and ``input_dtype``."""

    name: ClassVar[str]
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    backend: str = "gloo"
    input_dtype: torch.dtype = torch.float32
    # ZeRO-3 gathers partitioned weights inside forward, so every rank must take part in evaluation.
    evaluate_on_every_rank: ClassVar[bool] = False

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.spec = cfg, cfg.spec
        self.ckpts = Checkpoints.from_spec(cfg)
        self.model: torch.nn.Module
        self.forward: torch.nn.Module

    def log(self, msg: str) -> None:
        log0(self.rank, msg)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def init(self) -> None:
        raise NotImplementedError

    def prepare(self, model: torch.nn.Module, total_steps: int) -> None:
        raise NotImplementedError

    def autocast(self):
        return amp.autocast("fp32", self.device)

    def lr(self) -> float:
        raise NotImplementedError

    def step(self, loss: torch.Tensor, want_norm: bool) -> torch.Tensor | float | None:
        """Backward, averaged gradients, optimizer and schedule step; the gradient norm when asked for
        (None where the strategy cannot give it)."""
        raise NotImplementedError

    def start_mean(self, t: torch.Tensor, name: str = "train_loss") -> Callable[[], torch.Tensor]:
        """Start averaging ``t`` over the workers (every rank calls it, in the same order) and return what
        waits for the mean: the collective runs beside the steps that follow instead of holding them.
        ``name``: the collective's, where the strategy names them (Horovod refuses a name still in flight)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def due(self, step: int, end_of_epoch: bool) -> bool:
        return self.ckpts.due(step, end_of_epoch)

    def save(self, position: dict, step: int) -> None:
        """Every rank, when ``due``: checkpoint the run at ``position`` (epoch, batches_done, step, rng),
        and log ``checkpoint <name> saved at step <step>`` once it is on disk (maybe after this returns)."""
        raise NotImplementedError

    def resize(self, total_steps: int, lr_scale: float) -> None:
        """After a checkpoint of another number of workers was restored: the learning-rate schedule made to
        end after ``total_steps`` optimizer steps in all (the steps done included), its rates times
        ``lr_scale`` (the global batch's change)."""
        raise NotImplementedError

    def checkpoints_written(self, check: bool = True) -> None:
        """Every rank: wait until the checkpoints saved so far are on disk; with ``check``, raise if one
        could not be written."""
        self.ckpts.close(check)

    def load(self) -> tuple[str, dict] | None:
        """Every rank: restore the newest usable checkpoint; (its name, the position saved with it)."""
        raise NotImplementedError

    def final_model(self, recipe: Any, meta: dict, options: Any) -> torch.nn.Module:
        """Every rank: a plain fp32 module with the trained weights (for model.pt)."""
        return self.model

    def describe(self) -> str:
        compiled = " compile=torch.compile" if self.spec.distributed.compile else ""
        return f"backend={self.backend} device={self.device} precision={self.spec.distributed.precision}{compiled}"

    def shutdown(self) -> None:
        raise NotImplementedError


class TorchStrategy(Strategy):
    """A torch optimizer + cosine schedule, autocast / GradScaler, and torch checkpoint files (rank 0)."""

    def prepare(self, model: torch.nn.Module, total_steps: int) -> None:
        amp.check_precision(self.spec, self.cuda)
        self.model = model
        params = model.parameters()
        self.opt = self.wrap_optimizer(make_optimizer(params, self.spec.hyperparameters, self.cuda), model)
        self.sched = make_scheduler(self.opt, total_steps)
        self.scaler = amp.grad_scaler(self.spec.distributed.precision, self.device)
        forward = self.wrap_model(model)
        # Compiled around the DDP wrapper, so that its optimizer splits the graph at the gradient buckets
        # and the all-reduce of one bucket overlaps the backward of the next. Static shapes: an epoch's
        # smaller last batch gets a graph of its own rather than turning every later step's into a
        # dynamic-shape one. torch.compile of a module returns it wrapped (an OptimizedModule).
        if self.spec.distributed.compile:
            self.forward = cast(torch.nn.Module, torch.compile(forward, dynamic=False))
        else:
            self.forward = forward

    def resize(self, total_steps: int, lr_scale: float) -> None:
        # The cosine's next factors are ratios of cos(pi t / T_max) (torch's recursive form) applied to the
        # rate it is at: with the new T_max, the rate goes on from there and reaches its floor at the end.
        sched = cast(torch.optim.lr_scheduler.CosineAnnealingLR, self.sched)
        sched.T_max = max(total_steps, sched.last_epoch + 1)
        for group in self.opt.param_groups:
            group["lr"] *= lr_scale
        sched.base_lrs = [lr * lr_scale for lr in sched.base_lrs]
        sched._last_lr = [float(group["lr"]) for group in self.opt.param_groups]  # what lr() reports

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """What the loss runs the batch through (DDP: the wrapper that averages gradients in backward)."""
        return model

    def wrap_optimizer(self, opt: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
        return opt

    def autocast(self):
        return amp.autocast(self.spec.distributed.precision, self.device)

    def lr(self) -> float:
        return float(self.sched.get_last_lr()[0])  # torch types it float | Tensor (a tensor lr); ours are floats

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def averaged(self) -> None:
        """Wait until the gradients are averaged over the workers (DDP: done inside backward)."""

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()

    def step(self, loss, want_norm):
        self.zero_grad()
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        self.averaged()
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)  # the logged norm is that of the true gradients
        norm = total_norm(self.model) if want_norm else None
        self.optimizer_step()
        self.sched.step()
        return norm

    def state(self, position: dict) -> dict:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            **position,
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def save(self, position, step):
        """Rank 0, in the background (:meth:`Checkpoints.save_in_background`)."""
        if self.rank != 0:
            return

        def on_saved(path: Path) -> None:
            self.log(f"checkpoint {path.name} saved at step {step}")

        self.ckpts.save_in_background(self.state(position), step, on_saved)

    def load_file(self) -> dict | None:
        return self.ckpts.load_latest(self.log)
