"""The DDP training loop run in every torchrun worker.

Launched as ``torchrun ... -m trainyard.training.entry --config run.json``. Checkpoints carry model,
optimizer, scheduler, RNG and the data position (epoch + batches done in it), so a restarted worker group
(torchrun ``--max-restarts``) or an Airflow retry continues from the newest good checkpoint instead of
starting over.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainyard.training.common import (
    Checkpoints,
    Loop,
    RunConfig,
    Tracker,
    finish,
    grad_norm,
    log0,
    make_optimizer,
    recipe_for,
    resume_point,
)


def train(cfg: RunConfig) -> dict:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    log = lambda msg: log0(rank, msg)  # noqa: E731

    hp = cfg.spec["hyperparameters"]
    torch.manual_seed(hp["seed"])
    recipe = recipe_for(cfg)
    dataset, val, meta = recipe.load(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=hp["seed"])
    loader = DataLoader(dataset, batch_size=hp["batch_size"], sampler=sampler, drop_last=False)

    model = recipe.build_model(meta, recipe.opts(cfg.spec)).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None) if dist.is_initialized() else model
    opt = make_optimizer(ddp.parameters(), hp)
    total_steps = hp["epochs"] * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1))

    start_epoch, skip, step, resumed_from = 0, 0, 0, None
    state = Checkpoints.from_spec(cfg).load_latest(log)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start_epoch, skip, step = resume_point(state, len(loader), state["_path"], log)
        resumed_from = step

    tracker = Tracker(cfg) if rank == 0 else None
    log(f"strategy=ddp world_size={world} backend={backend} device={device} train={len(dataset)} "
        f"epochs={hp['epochs']} steps/epoch={len(loader)} start_step={step} recipe={recipe.name}")
    t0 = time.time()

    def optimize(loss: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients during backward
        norm = grad_norm(model)
        opt.step()
        return norm

    def mean(loss: torch.Tensor) -> float:
        reduced = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(reduced)  # SUM: gloo has no AVG
            reduced /= world
        return float(reduced)

    barrier = dist.barrier if dist.is_initialized() else (lambda: None)
    loop = Loop(cfg, recipe, model, ddp, opt, sched, sampler, loader, val, device, rank, world, optimize, mean, barrier)
    step = loop.run(start_epoch, skip, step, tracker, log)

    result = finish(model, cfg, recipe, val, meta, step, world, t0, tracker, resumed_from) if rank == 0 else {}
    if result:
        log(f"done: {json.dumps(result)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return result
