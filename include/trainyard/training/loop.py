"""The one worker loop, for every ``distributed.strategy``: what each process started by torchrun
or horovodrun runs (``trainyard.training.entry``).

The strategy (:mod:`trainyard.training.strategies`) owns process group, wrapping, step, averaging,
barrier and checkpoint format; this module owns the rest, once: seed, data sharding, the epoch loop, the
data position saved with each checkpoint and resumed from (torchrun ``--max-restarts`` or an Airflow
retry continue from the newest good checkpoint), logging, fault injection and the result record.

The step stays hot: no host sync and no tracking call per step. Each step's loss stays on the device;
every ``tracking.log_every_steps`` steps (and at each epoch end) the window of losses is averaged over the
workers in one collective, started then and waited for at the next window's end (so it runs beside the
steps, not between them; at an epoch's end or a checkpoint it is waited for at once), and rank 0's
background :class:`Tracker` gets one point at the window's last step: the window's mean loss (still a
tensor) and the learning rate, and the gradient norm at the steps that are a multiple of the interval.
One point per window, not per step, as Lightning's ``log_every_n_steps`` does: a metric point costs 28 us in
TensorBoard and more in MLflow's SQL store, all of it under the GIL the step needs, which per step held
the digits recipe (about 1 ms a step on CPU) to 0.82x a hand-written loop. The tracker starts first, so
its imports run while the data loads, and the loop waits for them to end (they would hold the GIL the
step needs).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from trainyard.recipes.base import Recipe
from trainyard.spec import Hyperparameters
from trainyard.training import handshake
from trainyard.training.common import atomic_save, resume_point, to_device
from trainyard.training.data import ShardSampler, already_batched
from trainyard.training.preemption import StopWord, record_stop
from trainyard.training.run_config import RunConfig
from trainyard.training.strategies.base import Strategy
from trainyard.training.tracking import READY_TIMEOUT_S, Tracker


def window_ends(total_steps: int, per_epoch: int, every: int) -> list[int]:
    """The steps that get a point of the curves: every ``every``-th step and each epoch's last."""
    return [s for s in range(1, total_steps + 1) if s % every == 0 or s % per_epoch == 0]


class Progress:
    """Throughput and ETA for the log."""

    def __init__(self, total_steps: int, start_step: int) -> None:
        self.total, self.start, self.t0 = total_steps, start_step, time.monotonic()

    def rates(self, step: int, samples: int) -> dict[str, float]:
        """Samples per second since the start and the seconds left at that pace, as curves."""
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        done = step - self.start
        eta = elapsed / done * (self.total - step) if done else float("nan")
        return {"samples_per_second": samples / elapsed, "eta_seconds": eta}

    def line(self, epoch: int, epochs: int, step: int, samples: int, **metrics: float) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        done = step - self.start
        eta = elapsed / done * (self.total - step) if done else float("nan")
        shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return (
            f"epoch {epoch}/{epochs} step {step}/{self.total} {shown} {samples / elapsed:.0f} samples/s ETA {eta:.0f}s"
        )


def device_use(strategy: Strategy) -> dict[str, float]:
    """On a GPU: the most memory this process held (GB) and the device's utilisation now (%, where NVML
    is there to say); nothing on CPUs."""
    if not strategy.cuda:
        return {}
    used = {"gpu_memory_gb": torch.cuda.max_memory_allocated(strategy.device) / 1e9}
    with contextlib.suppress(Exception):  # NVML (pynvml) missing or not answering: memory only
        used["gpu_utilization"] = float(torch.cuda.utilization(strategy.device))
    return used


def fail_once_at() -> int | None:
    """Chaos hook for the resume tests: TRAINYARD_FAIL_ONCE_AT_STEP=N crashes this process hard the first
    time step N is reached in this run directory (a marker file makes it once)."""
    target = os.environ.get("TRAINYARD_FAIL_ONCE_AT_STEP")
    return int(target) if target else None


def _crash(step: int, out_dir: str, strategy: Strategy) -> None:
    """The fault strikes after the step's checkpoint is on disk (the tests resume from it)."""
    marker = Path(out_dir) / f".fault-injected-{step}"
    if not marker.exists():
        strategy.checkpoints_written()
        marker.write_text(str(os.getpid()))
        print(f"[trainer] fault injection: crashing at step {step}", flush=True)
        os._exit(17)


class Window:
    """The steps since the last point: losses and grad norms as device tensors, the latest learning rate.
    A closed window's losses are averaged over the workers while the next window's steps run; its point
    goes to the tracker when that mean is in (at the next close, or at once at an epoch's end or a
    checkpoint)."""

    def __init__(self) -> None:
        self.reset()
        self.pending: tuple[Callable[[], torch.Tensor], list[int], float, dict[int, object]] | None = None

    def reset(self) -> None:
        self.steps: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.lr = float("nan")
        self.norms: dict[int, object] = {}

    def add(self, step: int, loss: torch.Tensor, lr: float, norm) -> None:
        self.steps.append(step)
        self.losses.append(loss.detach())
        self.lr = lr
        if norm is not None:
            self.norms[step] = norm

    def close(self, strategy: Strategy, tracker: Tracker | None, wait: bool) -> torch.Tensor | None:
        """Every rank: start averaging the window's losses over the workers (one collective), after the
        window before it is done. With ``wait`` (an epoch's end) finish it now and return the averaged
        losses, one per step."""
        self.finish(tracker)
        if not self.steps:
            return None
        self.pending = (strategy.start_mean(torch.stack(self.losses)), self.steps, self.lr, self.norms)
        self.reset()
        return self.finish(tracker) if wait else None

    def finish(self, tracker: Tracker | None) -> torch.Tensor | None:
        """Wait for the closed window's mean; rank 0 hands the tracker its point (mean loss, last learning
        rate, at its last step) and its gradient norms."""
        if self.pending is None:
            return None
        mean, steps, lr, norms = self.pending
        self.pending = None
        losses = mean()
        if tracker is not None:
            tracker.log([steps[-1]], {"train_loss": losses.mean(), "train_lr": lr})
            if norms:
                tracker.log(list(norms), {"train_grad_norm": list(norms.values())})
        return losses


def trial_stopped(cfg: RunConfig, strategy: Strategy, epoch: int, metrics: dict) -> bool:
    """A sweep trial's reporting point, on every rank at the end of ``epoch``: rank 0 reports the
    objective and waits for the launching task's answer; every rank learns it in one collective, so all
    stop together or none does."""
    stop = 0.0
    if strategy.rank == 0:
        value = float(metrics.get(cfg.trial_objective, float("nan")))
        handshake.report(cfg.out_dir, epoch, value)
        answer = handshake.wait_verdict(cfg.out_dir, epoch)
        if answer is None:
            strategy.log(f"sweep: no answer to epoch {epoch}'s report within {handshake.VERDICT_WAIT_S:.0f}s; going on")
        stop = 1.0 if answer else 0.0
    flag = torch.tensor([stop], dtype=torch.float32, device=strategy.device)
    return float(strategy.start_mean(flag, name="trial_stopped")()[0]) > 0


def train(cfg: RunConfig, strategy: Strategy, recipe: Recipe | None = None) -> dict:
    """Run the job's epochs with ``strategy``; rank 0 returns the result record (the others ``{}``; every
    rank of workers stopped on the word, ``{"preempted_at_step": step}``). The
    tracker and the process group are closed whatever happens, from the moment they exist. ``recipe``:
    the JobSpec's recipe unless given (``bench/gpu.py`` trains a model of its own through this loop)."""
    strategy.init()
    tracker = Tracker(cfg) if strategy.rank == 0 else None  # first, so its imports overlap the data loading
    word = StopWord(cfg.out_dir, strategy)  # from here on SIGTERM is the word to checkpoint and stop
    ok = False
    try:
        result = _train(cfg, strategy, tracker, recipe, word)
        ok = True
        return result
    finally:
        gc.unfreeze()  # the heap frozen for the loop is collectable again (train can run in a longer process)
        try:
            word.close(drain=ok)  # after a failure another rank may be gone: no collective is waited for
            # A run that fails still gets its last checkpoint onto the disk, for the retry to resume from.
            strategy.checkpoints_written(check=ok)  # an error of the run itself is the one to report
        finally:
            try:
                if tracker is not None:
                    tracker.close(check=ok)
            finally:
                strategy.shutdown()


def _loader(cfg: RunConfig, strategy: Strategy, dataset) -> tuple[ShardSampler, DataLoader]:
    """This rank's shard of the training data, in already-made batches."""
    hp, workers = cfg.spec.hyperparameters, cfg.spec.dataset.loader_workers
    sampler = ShardSampler(dataset, strategy.world, strategy.rank, hp.seed)
    loader = DataLoader(
        dataset,
        batch_size=hp.batch_size,
        sampler=sampler,
        drop_last=False,
        collate_fn=already_batched,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=strategy.cuda,  # page-locked batches: the copy to the GPU does not stall the host
    )
    return sampler, loader


class _Steps:
    """The hot part: an epoch's steps, with what they count (steps, samples, the last window's loss, the
    training thread's time in checkpoint saves; the write itself is off it)."""

    def __init__(
        self, cfg: RunConfig, strategy: Strategy, tracker: Tracker | None, recipe: Recipe, step: int, word: StopWord
    ) -> None:
        self.cfg, self.strategy, self.tracker, self.recipe, self.word = cfg, strategy, tracker, recipe, word
        self.step, self.samples, self.last_loss = step, 0, float("nan")
        self.stopped = False  # every rank agreed to stop on the word, at ``step``, checkpointed
        self.mid_epoch = False  # and that step was not its epoch's last
        self.stall, self.saves = 0.0, 0
        self.window = Window()
        self.fail_at = fail_once_at()

    def stopped_line(self) -> str:
        return f"preempted: every worker stops at step {self.step}, checkpointed; a later try resumes there"

    def timing(self, loop_s: float) -> dict:
        """This try's epoch loop (steps and per-epoch validation) for the result record."""
        return {
            "samples_per_second": round(self.samples / loop_s, 1) if self.samples else None,
            "loop_seconds": round(loop_s, 3),
            "checkpoint_stall_seconds": round(self.stall, 4),  # bench/loop.py reports it as a share of a step
            "checkpoints": self.saves,
        }

    def epoch(self, loader: DataLoader, epoch: int, first: int, progress: Progress) -> None:
        """The batches of ``epoch`` from the ``first`` on (a resumed run did those before)."""
        strategy, tracker, recipe, window = self.strategy, self.tracker, self.recipe, self.window
        device, world, per_epoch = strategy.device, strategy.world, first + len(loader)  # the loader's: those left
        log_every = self.cfg.spec.tracking.log_every_steps
        histogram_every = self.cfg.spec.tracking.histogram_every_steps
        for i, batch in enumerate(loader, start=first):
            batch = to_device(batch, device, strategy.input_dtype)
            with strategy.autocast():
                loss = recipe.loss(strategy.forward, batch)
            lr = strategy.lr()
            log_point = (self.step + 1) % log_every == 0
            norm = strategy.step(loss, want_norm=log_point)
            self.step += 1
            step = self.step
            self.samples += len(batch[0]) * world
            window.add(step, loss, lr, norm)
            if tracker is not None and histogram_every and step % histogram_every == 0:
                tracker.histograms(step, strategy.model)
            end_of_epoch = i + 1 == per_epoch
            if log_point or end_of_epoch:
                if tracker is not None:
                    tracker.log([step], progress.rates(step, self.samples))
                losses = window.close(strategy, tracker, wait=end_of_epoch)
                if losses is not None:
                    self.last_loss = float(losses.mean())  # the epoch's last window, as the curves show it
            stop = self.word.agreed()  # every rank, every step: the same answer on each
            if stop or strategy.due(step, end_of_epoch):  # logged by the strategy once on disk
                window.finish(tracker)  # every point up to the checkpoint's step goes before it exists
                saved_t0 = time.perf_counter()
                position = {"epoch": epoch, "batches_done": i + 1, "step": step, "world": strategy.world}
                strategy.save({**position, "rng": torch.get_rng_state()}, step)
                self.stall, self.saves = self.stall + time.perf_counter() - saved_t0, self.saves + 1
            if step == self.fail_at:
                _crash(step, self.cfg.out_dir, strategy)
            if stop:
                self.stopped, self.mid_epoch = True, not end_of_epoch
                return


def _resumed(strategy: Strategy, hp: Hyperparameters, per_epoch: int, size: int) -> tuple[int, int, int, int]:
    """Every rank: the newest usable checkpoint restored, and where the loop goes on (epoch, its batches
    done, step) and ends (its total steps); (0, 0, 0, all the steps) where there is none. A checkpoint of
    another number of workers (an elastic training's new size) is carried over by samples, with the
    learning rate scaled to the new global batch (``batch_size`` x the workers now); so is an elastic
    training's start short of its nodes, ``learning_rate`` being for its full size."""
    world, loaded = strategy.world, strategy.load()
    if loaded is None:
        epoch = skip = step = 0
        total = hp.epochs * per_epoch
        full = strategy.spec.resources.total_gpus  # learning_rate is for the job's full size
        then = full if strategy.spec.resources.elastic else world  # an elastic start before every node came
        change = f"started on {world} of {full} workers"
    else:
        source, position = loaded
        torch.set_rng_state(position["rng"])
        then = position.get("world", world)
        epoch, skip, step = resume_point(
            position, per_epoch, source, strategy.log, world=world, batch_size=hp.batch_size, size=size
        )
        total = step + (hp.epochs - epoch) * per_epoch - skip  # after a resize, not epochs x per_epoch
        change = f"{then} -> {world} worker(s)"
    if then != world:
        strategy.resize(total, lr_scale=world / then)
        strategy.log(
            f"{change}: the learning rate follows the global batch ({hp.batch_size} x {world}), x {world / then:g}; "
            f"the cosine schedule runs from step {step} to its end at step {total}"
        )
    return epoch, skip, step, total


def _train(cfg: RunConfig, strategy: Strategy, tracker: Tracker | None, recipe: Recipe | None, word: StopWord) -> dict:
    from trainyard import recipes

    spec, hp = cfg.spec, cfg.spec.hyperparameters
    rank, world, log = strategy.rank, strategy.world, strategy.log

    torch.manual_seed(hp.seed)
    if recipe is None:
        recipe = recipes.get(spec.recipe)
    options = recipe.opts(spec)
    dataset, val, meta = recipe.load(cfg)
    sampler, loader = _loader(cfg, strategy, dataset)
    per_epoch = len(loader)
    strategy.prepare(recipe.build_model(meta, options).to(strategy.device), hp.epochs * per_epoch)

    start_epoch, skip, step, total_steps = _resumed(strategy, hp, per_epoch, len(dataset))
    resumed_from = step if step else None
    log(
        f"strategy={strategy.name} world_size={world} {strategy.describe()} train={len(dataset)} "
        f"epochs={hp.epochs} steps/epoch={per_epoch} start_step={step} recipe={recipe.name}"
    )
    if tracker is not None:
        if not tracker.wait_ready():
            log(f"tracking: MLflow/TensorBoard not ready after {READY_TIMEOUT_S:.0f}s; training starts without waiting")
        tracker.check()  # tracking that cannot start fails the run now, not after the training
    # Everything alive now (modules, model, data) lives for the whole run: frozen, the collector stops
    # walking it. MLflow, SQLAlchemy and TensorBoard leave a large heap, and a full collection of it in
    # the middle of an epoch cost the digits recipe up to a third of its speed. train() unfreezes it.
    gc.collect()
    gc.freeze()
    t0 = time.time()
    progress = Progress(total_steps, step)
    steps = _Steps(cfg, strategy, tracker, recipe, step, word)
    pruned_at: int | None = None  # the epoch after which a sweep's pruner stopped this trial
    loop_t0 = time.perf_counter()
    for epoch in range(start_epoch, hp.epochs):
        epoch_t0 = time.perf_counter()
        first = skip if epoch == start_epoch else 0  # the batches a resumed run did already
        sampler.set_epoch(epoch, skip_samples=first * hp.batch_size)
        steps.epoch(loader, epoch, first, progress)
        if steps.stopped and steps.mid_epoch:  # the rest of the epoch, and its validation, on resuming
            log(steps.stopped_line())
            break
        metrics = {}
        if rank == 0 or strategy.evaluate_on_every_rank:
            metrics = recipe.val_metrics(strategy.model, val, strategy.device, strategy.input_dtype)
        log(progress.line(epoch + 1, hp.epochs, steps.step, steps.samples, loss=steps.last_loss, **metrics))
        if cfg.trial_objective is not None and trial_stopped(cfg, strategy, epoch + 1, metrics):
            log(f"sweep: the pruner stopped this trial after epoch {epoch + 1}; every worker ends here")
            pruned_at = epoch + 1
        if tracker is not None:
            # the epoch's wall time (steps, checkpoint, validation) as a curve: slow epochs show in the UI;
            # a resumed try's first epoch is only its rest
            timed = {} if first else {"epoch_seconds": time.perf_counter() - epoch_t0}
            tracker.log([steps.step], {**metrics, "epoch": epoch + 1, **timed, **device_use(strategy)})
        strategy.barrier()
        if steps.stopped:  # at its epoch's end: the epoch validated and logged, the next one on resuming
            log(steps.stopped_line())
            break
        if pruned_at is not None:
            break

    loop_s = time.perf_counter() - loop_t0
    strategy.checkpoints_written()
    if steps.stopped:  # no model: the launcher hands the job back to the queue, and its next try resumes
        if rank == 0:
            record_stop(cfg.out_dir, steps.step)
        return {"preempted_at_step": steps.step}  # every rank: a pod's workers exit non-zero on it (entry)
    if pruned_at is not None:  # no model: the launching task ends the trial as pruned and removes its files
        return {"pruned_at_epoch": pruned_at, "steps": steps.step} if rank == 0 else {}
    final = strategy.final_model(recipe, meta, options)
    result: dict = {}
    if rank == 0:
        result = finish(final, cfg, recipe, val, meta, steps.step, world, t0, resumed_from, steps.timing(loop_s))
        log(f"done: {json.dumps(result)}")
    return result


def finish(
    model: torch.nn.Module,
    cfg: RunConfig,
    recipe,
    val,
    meta: dict,
    steps: int,
    world: int,
    t0: float,
    resumed_from_step: int | None,
    timing: dict,
) -> dict:
    """Rank 0: the final model file and the result record the train task reads (``timing``: this try's
    epoch loop, as ``_train`` measured it)."""
    out_dir = Path(cfg.out_dir)
    atomic_save(recipe.model_blob(model, meta), out_dir / "model.pt")
    metrics = recipe.val_metrics(model, val, next(model.parameters()).device)
    result = {
        "model_path": str(out_dir / "model.pt"),
        "recipe": recipe.name,
        "steps": steps,
        "epochs": cfg.spec.hyperparameters.epochs,
        "world_size": world,
        "strategy": cfg.spec.distributed.strategy,
        "train_seconds": round(time.time() - t0, 3),
        **metrics,
        "resumed_from_step": resumed_from_step,
        **timing,
    }
    (out_dir / "train_result.json").write_text(json.dumps(result, indent=1))
    return result
