"""``distributed.strategy: deepspeed``: the processes torchrun starts, one ZeRO engine.

* ``deepspeed.initialize`` with the config made from the JobSpec (:mod:`trainyard.training.deepspeed_config`):
  the optimizer, ZeRO stage and bf16 / fp16 from the spec, and the loop's cosine schedule passed in as a
  torch scheduler, so DeepSpeed steps it and keeps its state in its checkpoints.
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
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from trainyard.training.common import Checkpoints, make_scheduler
from trainyard.training.deepspeed_config import deepspeed_config
from trainyard.training.strategies.base import Strategy, cuda_device, start_all_reduce_mean, total_norm

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

        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )


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
        return sorted(found, key=_tag_step, reverse=True)

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
        self.ckpts.saved()
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
        complete = [t for t in self.tags() if (self.dir / t / MARKER).is_file()]
        if not complete:
            return
        kept, newest = set(complete[: self.ckpts.keep]), _tag_step(complete[0])
        for tag in self.tags():
            if tag not in kept and _tag_step(tag) < newest:
                shutil.rmtree(self.dir / tag, ignore_errors=True)

    def load_latest(self) -> tuple[str, dict] | None:
        """All ranks: load the newest tag every rank can load; (tag, client_state) or None."""
        touched = False
        for tag in self.tags():
            problem = self.check(tag)
            if not _all(problem is None, self.device):
                self.log(
                    f"checkpoint {tag} is unusable ({problem or 'not readable on another rank'}); "
                    "trying the previous one"
                )
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


def _tag_step(tag: str) -> int:
    match = TAG_RE.match(tag)
    assert match is not None, tag  # tags() lists matching names only
    return int(match.group(1))


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"
    evaluate_on_every_rank = True

    def init(self) -> None:
        # ZeRO calls all_gather_into_tensor/reduce_scatter_tensor, which torch 2.13 deprecates: noise in every log.
        warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
        cuda = torch.cuda.is_available()
        if not cuda:
            _cpu_setup()
        import deepspeed

        _single_process_env()
        if cuda:
            self.device, self.backend = cuda_device(int(os.environ.get("LOCAL_RANK", 0))), "nccl"
        deepspeed.init_distributed(dist_backend=self.backend)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def prepare(self, model, total_steps):
        import deepspeed

        ds_cfg = deepspeed_config(self.spec, self.world, cuda=self.cuda)
        self.stage = ds_cfg["zero_optimization"]["stage"]
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters(),
            config=ds_cfg,
            # The torch strategies' schedule; DeepSpeed steps it in engine.step() and checkpoints its state.
            lr_scheduler=lambda opt: make_scheduler(opt, total_steps),
        )
        self.model, self.forward = self.engine.module, self.engine
        if self.engine.bfloat16_enabled():
            self.input_dtype = torch.bfloat16
        elif self.engine.fp16_enabled():
            self.input_dtype = torch.float16
        self.engine.train()
        self.sharded = DeepSpeedCheckpoints(self.ckpts, self.engine, self.rank, self.device, self.log)

    def lr(self) -> float:
        return self.engine.get_lr()[0]

    def step(self, loss, want_norm):
        self.engine.backward(loss)
        local = total_norm(self.engine.module) if want_norm and self.stage == 0 else None  # ZeRO keeps its own
        self.engine.step()
        if not want_norm:
            return None
        norm = self.engine.get_global_grad_norm()
        return norm if norm is not None else local

    def start_mean(self, t, name="train_loss"):
        return start_all_reduce_mean(t, self.world)

    def barrier(self) -> None:
        dist.barrier()

    def due(self, step, end_of_epoch):
        return self.sharded.due(step, end_of_epoch, self.world)

    def save(self, position, step):
        tag = self.sharded.save(position, step)
        self.log(f"checkpoint {tag} saved at step {step}")

    def load(self):
        return self.sharded.load_latest()

    def final_model(self, recipe, meta, options):
        """All ranks (ZeRO-3 gathers the partitioned weights): a plain fp32 model with the trained weights."""
        import deepspeed

        model = recipe.build_model(meta, options)
        with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters())):  # a no-op below stage 3
            model.load_state_dict({k: v.detach().float().cpu() for k, v in self.engine.module.state_dict().items()})
        return model

    def describe(self) -> str:
        return (
            f"zero_stage={self.stage} precision={self.spec.distributed.precision} backend={self.backend} "
            f"device={self.device}"
        )

    def shutdown(self) -> None:
        dist.barrier()
        dist.destroy_process_group()
