"""The DeepSpeed (ZeRO) training loop run in every process the deepspeed launcher starts.

Launched as ``python -m deepspeed.launcher.runner ... --module trainyard.training.entry --config run.json``
(see :mod:`trainyard.training.launchers.deepspeed`). Same data, model, logging, tracking and result as the
DDP loop in :mod:`trainyard.training.trainer`; the differences:

* ``deepspeed.initialize`` with the config made from the JobSpec (:mod:`.deepspeed_config`): SGD from the
  config, ZeRO stage and bf16 from ``distributed``, and the DDP loop's cosine schedule passed in as a torch
  scheduler, so DeepSpeed steps it and keeps its state in its checkpoints.
* Checkpoints are DeepSpeed's own (``save_checkpoint``/``load_checkpoint``): a directory per tag
  ``step-XXXXXXXX`` under ``<out_dir>/checkpoints`` holding every rank's ZeRO partition, written by all
  ranks together. When every rank has written, rank 0 fsyncs the files and writes ``trainyard.json`` (the
  data position and each file's size) last: a tag without it, or whose files no longer match it, was cut
  short and is skipped on resume, which falls back to the previous tag. The last
  ``checkpointing.keep_last`` complete tags are kept.
* On CPU: gloo, ``DS_ACCELERATOR=cpu``, and DeepSpeed's shared-memory collective kernel is not built
  (see :func:`_cpu_setup`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainyard.recipes.base import to_device
from trainyard.training.common import (
    Checkpoints,
    Progress,
    RunConfig,
    Tracker,
    fault_injection,
    finish,
    grad_norm,
    log0,
    recipe_for,
    resume_point,
)
from trainyard.training.deepspeed_config import deepspeed_config

TAG_RE = re.compile(r"^step-(\d{8})$")
MARKER = "trainyard.json"


def _cpu_setup() -> None:
    """Before DeepSpeed is imported on a machine without CUDA.

    DeepSpeed's CPU communication backend JIT-compiles a shared-memory all-reduce kernel with ninja and g++
    the first time ``init_distributed`` runs (about a minute on 2 cores, a compiler in every image, and a
    build lock that, left behind by a killed task, hangs every later run). That kernel only serves
    ``inference_all_reduce`` (tensor-parallel inference); ZeRO training uses the gloo collectives.
    Marking the op incompatible makes DeepSpeed use plain gloo. ``__compatible_ops__`` is the dict
    DeepSpeed consults for this, and its edits persist (deepspeed/ops/__init__.py).
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _single_process_env() -> None:
    """Run without a launcher (``python -m trainyard.training.entry``) as a world of one, instead of
    DeepSpeed's MPI discovery."""
    if "RANK" not in os.environ:
        from trainyard.training.launchers.deepspeed import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))


def _all(flag: bool, device: torch.device) -> bool:
    """True on every rank iff ``flag`` is true on every rank."""
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _from_rank0(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([1 if flag else 0], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


class DeepSpeedCheckpoints:
    """DeepSpeed checkpoint tags under ``ckpts.dir``, with ``ckpts``' interval and ``keep``."""

    def __init__(self, ckpts: Checkpoints, engine, rank: int, device: torch.device, log) -> None:
        self.ckpts, self.engine, self.rank, self.device, self.log = ckpts, engine, rank, device, log

    @property
    def dir(self) -> Path:
        return self.ckpts.dir

    def tags(self) -> list[str]:
        """Every tag directory, complete or not, newest first."""
        if not self.dir.is_dir():
            return []
        found = [p.name for p in self.dir.iterdir() if p.is_dir() and TAG_RE.match(p.name)]
        return sorted(found, key=lambda t: int(TAG_RE.match(t).group(1)), reverse=True)

    def check(self, tag: str) -> str | None:
        """Why ``tag`` cannot be loaded, or None when its files are all there as written."""
        marker = self.dir / tag / MARKER
        if not marker.is_file():
            return "incomplete (no trainyard.json: the save was cut short)"
        try:
            files = json.loads(marker.read_text())["files"]
        except (OSError, ValueError, KeyError) as err:
            return f"unreadable {MARKER} ({type(err).__name__}: {err})"
        for rel, size in files.items():
            path = self.dir / tag / rel
            if not path.is_file():
                return f"missing {rel}"
            if path.stat().st_size != size:
                return f"{rel} is {path.stat().st_size} bytes, was written as {size}"
        return None

    def due(self, step: int, end_of_epoch: bool, world: int) -> bool:
        due = self.ckpts.due(step, end_of_epoch)
        if self.ckpts.every_minutes and not self.ckpts.every_steps and world > 1:
            # A time interval is read off each rank's clock; saving is collective, so rank 0 decides.
            due = _from_rank0(due, self.device)
        return due

    def save(self, state: dict, step: int) -> str:
        """All ranks: DeepSpeed writes its files; then rank 0 seals the tag and prunes old ones."""
        tag = f"step-{step:08d}"
        self.engine.save_checkpoint(str(self.dir), tag=tag, client_state=state)  # ends in a barrier
        if self.rank == 0:
            self._seal(tag, state)
            self._prune()
        # Checkpoints.due() measures every_minutes from its last save (common.Checkpoints.save sets this).
        self.ckpts._last_time = time.monotonic()
        return tag

    def _seal(self, tag: str, state: dict) -> None:
        root = self.dir / tag
        files = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MARKER):
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
            files[str(path.relative_to(root))] = path.stat().st_size
        info = {k: state[k] for k in ("epoch", "batches_done", "step")}
        tmp = root / f".{MARKER}.tmp"
        with open(tmp, "w") as fh:
            json.dump({**info, "files": files}, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, root / MARKER)

    def _prune(self) -> None:
        """Keep the newest ``keep`` complete tags. Drop older complete ones and any cut-short tag older than
        the newest complete one; a cut-short tag newer than that is left to be overwritten."""
        step = lambda tag: int(TAG_RE.match(tag).group(1))  # noqa: E731
        complete = [t for t in self.tags() if (self.dir / t / MARKER).is_file()]
        if not complete:
            return
        kept, newest = set(complete[: self.ckpts.keep]), step(complete[0])
        for tag in self.tags():
            if tag not in kept and step(tag) < newest:
                shutil.rmtree(self.dir / tag, ignore_errors=True)

    def load_latest(self) -> tuple[str, dict] | None:
        """All ranks: load the newest tag every rank can load; (tag, client_state) or None."""
        touched = False
        for tag in self.tags():
            problem = self.check(tag)
            if not _all(problem is None, self.device):
                self.log(f"checkpoint {tag} is unusable ({problem or 'not readable on another rank'}); "
                         "trying the previous one")
                continue
            touched = True
            try:
                path, client = self.engine.load_checkpoint(str(self.dir), tag=tag)
                err = None if path is not None and client is not None else "DeepSpeed found no checkpoint"
            except Exception as exc:  # noqa: BLE001 - any failure means "try the previous one"
                err = f"{type(exc).__name__}: {exc}"
            if _all(err is None, self.device):
                return tag, client
            self.log(f"checkpoint {tag} failed to load ({err or 'on another rank'}); trying the previous one")
        if touched:
            # A failed load may have left part of its state in the model or optimizer.
            raise RuntimeError(f"no checkpoint under {self.dir} could be loaded; remove it to start over")
        return None


def _precision_dtype(engine) -> torch.dtype:
    if engine.bfloat16_enabled():
        return torch.bfloat16
    if engine.fp16_enabled():
        return torch.float16
    return torch.float32


def _fp32_copy(engine, recipe, meta: dict, options: dict) -> torch.nn.Module:
    """All ranks (ZeRO-3 gathers the partitioned weights): a plain fp32 model with the trained weights,
    for model.pt and the final evaluation."""
    import deepspeed

    model = recipe.build_model(meta, options)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # a no-op below stage 3
        model.load_state_dict({k: v.detach().float().cpu() for k, v in engine.module.state_dict().items()})
    return model


def train(cfg: RunConfig) -> dict:
    # ZeRO calls all_gather_into_tensor/reduce_scatter_tensor, which torch 2.13 deprecates: noise in every log.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    use_cuda = torch.cuda.is_available()
    if not use_cuda:
        _cpu_setup()
    import deepspeed

    _single_process_env()
    backend = "nccl" if use_cuda else "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    log = lambda msg: log0(rank, msg)  # noqa: E731

    hp = cfg.spec["hyperparameters"]
    ds_cfg = deepspeed_config(cfg.spec, world, cuda=use_cuda)
    stage = ds_cfg["zero_optimization"]["stage"]
    precision = cfg.spec.get("distributed", {}).get("precision", "fp32")
    torch.manual_seed(hp["seed"])
    recipe = recipe_for(cfg)
    options = recipe.opts(cfg.spec)
    dataset, val, meta = recipe.load(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=hp["seed"])
    loader = DataLoader(dataset, batch_size=hp["batch_size"], sampler=sampler, drop_last=False)
    total_steps = hp["epochs"] * len(loader)

    model = recipe.build_model(meta, options).to(device)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        config=ds_cfg,
        # The DDP loop's schedule; DeepSpeed steps it in engine.step() and checkpoints its state.
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1)),
    )
    dtype = _precision_dtype(engine)

    ckpts = DeepSpeedCheckpoints(Checkpoints.from_spec(cfg), engine, rank, device, log)
    start_epoch, skip, step, resumed_from = 0, 0, 0, None
    loaded = ckpts.load_latest()
    if loaded is not None:
        tag, state = loaded
        torch.set_rng_state(state["rng"])
        start_epoch, skip, step = resume_point(state, len(loader), tag, log)
        resumed_from = step

    tracker = Tracker(cfg) if rank == 0 else None
    log(f"strategy=deepspeed world_size={world} zero_stage={stage} precision={precision} backend={backend} "
        f"device={device} train={len(dataset)} epochs={hp['epochs']} "
        f"steps/epoch={len(loader)} start_step={step} recipe={recipe.name}")
    t0 = time.time()
    progress = Progress(total_steps, step)
    samples = 0
    reduced = torch.tensor(float("nan"))
    engine.train()
    for epoch in range(start_epoch, hp["epochs"]):
        sampler.set_epoch(epoch)  # the same permutation after a restart, so skipping resumes the data position
        for i, batch in enumerate(loader):
            if epoch == start_epoch and i < skip:
                continue
            batch = to_device(batch, device, dtype)
            loss = recipe.loss(engine, batch)
            engine.backward(loss)
            lr = engine.get_lr()[0]
            local_norm = grad_norm(engine.module) if stage == 0 else None  # ZeRO keeps its own
            engine.step()
            norm = engine.get_global_grad_norm()
            norm = float(norm) if norm is not None else local_norm
            step += 1
            samples += len(batch[0]) * world
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)  # SUM: gloo has no AVG
            reduced /= world
            metrics = {"train_loss": float(reduced), "train_lr": lr}
            if norm is not None:
                metrics["train_grad_norm"] = norm
            if tracker:
                tracker.log(metrics, step)
            end_of_epoch = i + 1 == len(loader)
            if ckpts.due(step, end_of_epoch, world):
                tag = ckpts.save({"epoch": epoch, "batches_done": i + 1, "step": step,
                                  "rng": torch.get_rng_state()}, step)
                log(f"checkpoint {tag} saved at step {step}")
            fault_injection(step, cfg.out_dir)
        metrics = recipe.val_metrics(engine.module, val, device, dtype)  # every rank: ZeRO-3 gathers weights in forward
        log(progress.line(epoch + 1, hp["epochs"], step, samples, loss=float(reduced), **metrics))
        if tracker:
            tracker.log({**metrics, "epoch": epoch + 1}, step)
        dist.barrier()

    final = _fp32_copy(engine, recipe, meta, options)
    result = finish(final, cfg, recipe, val, meta, step, world, t0, tracker, resumed_from) if rank == 0 else {}
    if result:
        log(f"done: {json.dumps(result)}")
    dist.barrier()
    dist.destroy_process_group()
    return result
