"""The Horovod training loop run in every horovodrun worker (``distributed.strategy: horovod``).

Launched as ``horovodrun -np N -H localhost:N --gloo python -m trainyard.training.entry --config run.json``.
The same loop as the DDP trainer (``trainer.py``): the same data sharding, optimizer, schedule,
checkpoint format (model, optimizer, scheduler, RNG, epoch + batches done + step) and result record;
only the collective layer differs: ``hvd.DistributedOptimizer`` averages the gradients, rank 0 alone
reads the newest checkpoint and broadcasts the weights, optimizer state and data position to the others.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import torch
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


def _import_horovod():
    try:
        import horovod.torch as hvd
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise ImportError(
            f"distributed.strategy 'horovod' needs horovod.torch ({err}); build it into the venv with "
            "scripts/build_horovod.sh"
        ) from err
    return hvd


def _gloo_env_from_torchrun() -> None:
    """On Kubernetes there is no horovodrun (it needs ssh): torchrun starts the workers, and this maps its
    environment onto Horovod's gloo bootstrap (HOROVOD_RANK, ... and an HTTP rendezvous server run by
    rank 0 on HOROVOD_GLOO_RENDEZVOUS_PORT). Under horovodrun, HOROVOD_RANK is already set and this is a no-op."""
    if "HOROVOD_RANK" in os.environ or "GROUP_RANK" not in os.environ:
        return
    rank = int(os.environ["RANK"])
    os.environ.update(
        HOROVOD_RANK=os.environ["RANK"],
        HOROVOD_LOCAL_RANK=os.environ["LOCAL_RANK"],
        HOROVOD_CROSS_RANK=os.environ["GROUP_RANK"],
        HOROVOD_HOSTNAME=socket.gethostname(),
        HOROVOD_GLOO_RENDEZVOUS_ADDR=os.environ["MASTER_ADDR"],
    )
    port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    if rank == 0:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=2).close()
            return
        except OSError:
            if time.time() > deadline:
                raise RuntimeError(f"Horovod rendezvous server {os.environ['MASTER_ADDR']}:{port} never came up")
            time.sleep(0.2)


def train(cfg: RunConfig) -> dict:
    hvd = _import_horovod()
    _gloo_env_from_torchrun()
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    # GPU tensors need a Horovod built with NCCL; the CPU (Gloo-only) build trains on the CPU.
    use_cuda = torch.cuda.is_available() and bool(hvd.nccl_built())
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device(f"cuda:{hvd.local_rank()}" if use_cuda else "cpu")
    log = lambda msg: log0(rank, msg)  # noqa: E731

    hp = cfg.spec["hyperparameters"]
    torch.manual_seed(hp["seed"])
    recipe = recipe_for(cfg)
    dataset, val, meta = recipe.load(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=hp["seed"])
    loader = DataLoader(dataset, batch_size=hp["batch_size"], sampler=sampler, drop_last=False)

    model = recipe.build_model(meta, recipe.opts(cfg.spec)).to(device)
    opt = make_optimizer(model.parameters(), hp)
    # Averages the gradients over the workers (allreduce hooks fire during backward), like DDP.
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    total_steps = hp["epochs"] * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1))

    start_epoch, skip, step, resumed_from = 0, 0, 0, None
    # Rank 0 reads the checkpoint; the others get everything from it, so they can never disagree on
    # which file (or which data position) they resume from.
    state = Checkpoints.from_spec(cfg).load_latest(log) if rank == 0 else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    position = None
    if state is not None:
        position = {k: state[k] for k in ("scheduler", "rng", "epoch", "batches_done", "step", "_path")}
    position = hvd.broadcast_object(position, root_rank=0, name="resume_position")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if position is not None:
        sched.load_state_dict(position["scheduler"])
        torch.set_rng_state(position["rng"])
        start_epoch, skip, step = resume_point(position, len(loader), position["_path"], log)
        resumed_from = step

    tracker = Tracker(cfg) if rank == 0 else None
    log(f"strategy=horovod world_size={world} backend=gloo device={device} "
        f"train={len(dataset)} epochs={hp['epochs']} steps/epoch={len(loader)} start_step={step} recipe={recipe.name}")
    t0 = time.time()

    def optimize(loss: torch.Tensor) -> float:
        opt.zero_grad()  # Horovod's override takes no set_to_none (torch's default is already None)
        loss.backward()
        opt.synchronize()  # wait for the averaged gradients, so the logged norm is the one applied
        norm = grad_norm(model)
        with opt.skip_synchronize():
            opt.step()
        return norm

    def mean(loss: torch.Tensor) -> float:
        return float(hvd.allreduce(loss.detach(), op=hvd.Average, name="train_loss"))

    loop = Loop(cfg, recipe, model, model, opt, sched, sampler, loader, val, device, rank, world, optimize, mean,
                hvd.barrier)
    step = loop.run(start_epoch, skip, step, tracker, log)

    result = finish(model, cfg, recipe, val, meta, step, world, t0, tracker, resumed_from) if rank == 0 else {}
    if result:
        log(f"done: {json.dumps(result)}")
    hvd.barrier()  # the others wait for rank 0's model and result before Horovod goes down
    hvd.shutdown()
    return result
