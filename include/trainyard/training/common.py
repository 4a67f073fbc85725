"""Pieces every strategy of the worker loop (:mod:`trainyard.training.loop`) shares: the optimizer and
schedule made from the JobSpec, torch checkpoint files, the resume position, progress lines."""

from __future__ import annotations

import io
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from trainyard.spec import Hyperparameters
from trainyard.training.run_config import RunConfig

CKPT_RE = re.compile(r"^step-(\d{8})\.pt$")


def log0(rank: int, msg: str) -> None:
    """A line of rank 0's log, written in one call (the checkpoint writer's thread logs too)."""
    if rank == 0:
        sys.stdout.write(f"[trainer] {msg}\n")
        sys.stdout.flush()


def make_optimizer(params, hp: Hyperparameters, cuda: bool = False) -> torch.optim.Optimizer:
    """``hyperparameters.optimizer``: SGD with momentum, or AdamW (what transformers and detectors like).
    On CUDA the fused implementation: one kernel for all parameters instead of several per tensor."""
    fused = True if cuda else None  # None: torch's default for the device (fused is CUDA-only here)
    if hp.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay, fused=fused)
    return torch.optim.SGD(params, lr=hp.learning_rate, momentum=hp.momentum, weight_decay=hp.weight_decay, fused=fused)


def make_scheduler(opt: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Cosine decay over the whole run, stepped once per optimizer step (every strategy, DeepSpeed too)."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1))


def atomic_save(obj, path: Path) -> None:
    """Write to a temp file, fsync, rename, fsync the folder: a crash leaves the old file or the new one,
    never half, and the rename survives a power loss."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(buffer.getbuffer(), path)


def atomic_write_bytes(data, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


class Checkpoints:
    """Atomic checkpoints named by global step, at a step or time interval (else every epoch), keeping
    the last ``keep``; loading falls back past unreadable files to the newest good one."""

    def __init__(
        self, directory: Path, every_steps: int | None = None, every_minutes: float | None = None, keep: int = 3
    ) -> None:
        self.dir = Path(directory)
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self._last_time = time.monotonic()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    @classmethod
    def from_spec(cls, cfg: RunConfig) -> Checkpoints:
        c = cfg.spec.checkpointing
        return cls(cfg.checkpoint_dir, c.every_steps, c.every_minutes, c.keep_last)

    def files(self) -> list[Path]:
        """Newest first."""
        if not self.dir.exists():
            return []
        steps = {p: int(m.group(1)) for p in self.dir.glob("step-*.pt") if (m := CKPT_RE.match(p.name))}
        return sorted(steps, key=steps.__getitem__, reverse=True)

    def due(self, step: int, end_of_epoch: bool) -> bool:
        if self.every_steps:
            return step % self.every_steps == 0
        if self.every_minutes:
            return (time.monotonic() - self._last_time) >= self.every_minutes * 60
        return end_of_epoch

    def saved(self) -> None:
        """``every_minutes`` counts from the last save (DeepSpeed's tags call this too)."""
        self._last_time = time.monotonic()

    def save(self, state: dict, step: int) -> Path:
        """Write the checkpoint of ``step`` now (atomically) and prune the oldest beyond ``keep``."""
        self.saved()
        return self._write(state, step)

    def _write(self, state: dict, step: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step-{step:08d}.pt"
        atomic_save(state, path)
        self._prune()
        return path

    def _prune(self) -> None:
        for old in self.files()[self.keep :]:
            old.unlink(missing_ok=True)

    def save_in_background(self, state: dict, step: int, on_saved: Callable[[Path], None]) -> None:
        """Serialise ``state`` now (``torch.save`` into memory: a snapshot with the tensors copied to the host,
        shared storage and state-dict metadata kept as a file keeps them), then write, fsync and rename it on
        a background thread while training goes on: the disk's latency leaves the step. One write at a
        time: this first waits for the one before, and raises its error. ``on_saved(path)`` runs once the
        file is in place, so what it reports is on disk. :meth:`close` before the process ends or reads the
        checkpoints.

        Not ``torch.distributed.checkpoint.async_save``: that writes a folder of per-rank shards in DCP's own
        format, read back through DCP with a process group, where every reader here (resume, the export,
        ``trainyard replay``, a user's ``torch.load``) takes one ``step-*.pt`` file; and the stall this
        thread leaves the step is small already (bench/loop.py: 2.1 ms a save at 1 process, 1.3 % of a
        digits epoch, against 2.8 ms for a plain ``torch.save``; BENCHMARKS.md)."""
        self.wait()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.saved()  # the interval counts from the snapshot
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainyard-checkpoint")
        self._pending = self._writer.submit(lambda: on_saved(self._write_bytes(buffer, step)))

    def _write_bytes(self, buffer: io.BytesIO, step: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step-{step:08d}.pt"
        atomic_write_bytes(buffer.getbuffer(), path)
        self._prune()
        return path

    def wait(self) -> None:
        """Until the background write (if any) is on disk; its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, check: bool = True) -> None:
        """Wait for the background write and stop its thread; with ``check`` its error is raised, else
        printed (a run that failed already reports its own error). Saving again starts a new thread."""
        try:
            self.wait()
        except Exception as err:
            if check:
                raise
            print(f"[trainer] checkpoint write failed: {type(err).__name__}: {err}", flush=True)
        finally:
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None

    def load_latest(self, log=print) -> dict | None:
        for path in self.files():
            try:
                # tensors and plain values only: a file planted in checkpoints/ cannot run code when loaded
                state = torch.load(path, map_location="cpu", weights_only=True)
                state["_path"] = path.name
                return state
            except Exception as err:  # noqa: BLE001 - any unreadable file means "try the previous one"
                log(f"checkpoint {path.name} is unreadable ({type(err).__name__}: {err}); trying the previous one")
        return None


def resume_point(
    state: dict, batches_per_epoch: int, source: str, log, *, world: int, batch_size: int, size: int
) -> tuple[int, int, int]:
    """(epoch, batches to skip in it, global step) to continue from a checkpoint's data position; a
    checkpoint taken after an epoch's last batch continues with the next epoch.

    On another number of workers than the checkpoint's (``world``, an elastic training that lost or got
    back nodes), the position is carried over by samples: each epoch's order is one permutation that the
    ranks take strided (:class:`trainyard.training.data.ShardSampler`), so what was done is its first
    ``then x (each rank's samples done)`` samples; each of the ``world`` ranks now skips its share of
    them in whole batches, so fewer than ``world x batch_size`` samples are trained twice, none skipped.
    ``size``: the training set's; ``batch_size``: each worker's."""
    epoch, skip, step = state["epoch"], state["batches_done"], state["step"]
    then = state.get("world", world)
    if then != world:
        done = min(skip * batch_size, math.ceil(size / then)) * then
        if done >= size:
            epoch, skip, again = epoch + 1, 0, 0
        else:
            skip = done // (world * batch_size)
            again = done - skip * world * batch_size
        log(f"resuming on {world} worker(s) what {then} trained: {min(done, size)} of the epoch's {size} samples "
            f"were done, {again} of them are trained again")  # fmt: skip
    if skip >= batches_per_epoch:
        epoch, skip = epoch + 1, 0
    log(f"resumed from checkpoint {source} at step {step} (epoch {epoch + 1}, batch {skip})")
    return epoch, skip, step


def evaluate(model: torch.nn.Module, batches: Iterable[list[torch.Tensor]]) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of a classifier over (inputs, labels) batches."""
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            logits = model(x).float()
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    model.train(was_training)
    return correct / max(count, 1), loss_sum / max(count, 1)


def to_device(batch, device: torch.device, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Move a batch. The model's input (the first tensor) takes the training dtype (bf16 under DeepSpeed)
    when it is floating; targets keep theirs: a bf16 Gaussian heatmap would round 0.998 to a false 1.0.
    The copies to a GPU do not wait (from the pinned memory the training DataLoader hands out, they overlap
    the work queued before them); the kernels that read the batch are queued after them on the stream."""
    first, *rest = batch
    if first.is_floating_point():
        first = first.to(device, dtype, non_blocking=True)
    else:
        first = first.to(device, non_blocking=True)
    return [first, *(t.to(device, non_blocking=True) for t in rest)]
