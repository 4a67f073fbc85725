"""Pieces every trainer (DDP, Horovod, DeepSpeed) shares: run config, data, tracking, checkpoints,
progress. Rank 0 alone writes checkpoints, the final model and tracking records."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainyard.recipes.base import to_device

CKPT_RE = re.compile(r"^step-(\d{8})\.pt$")


@dataclass
class RunConfig:
    """What the train task hands to the workers (written as JSON next to the run's outputs)."""

    spec: dict
    data: dict  # the prepared-data manifest
    out_dir: str
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    tensorboard_dir: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        return cls(**json.loads(Path(path).read_text()))

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"


def log0(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[trainer] {msg}", flush=True)


def recipe_for(cfg: RunConfig):
    """The run's recipe: its data, model, loss and per-epoch metrics (see trainyard.recipes.base)."""
    from trainyard import recipes

    return recipes.get(cfg.spec.get("recipe", "digits_cnn"))


def make_optimizer(params, hp: dict) -> torch.optim.Optimizer:
    """``hyperparameters.optimizer``: SGD with momentum, or AdamW (what transformers and detectors like)."""
    if hp.get("optimizer", "sgd") == "adamw":
        return torch.optim.AdamW(params, lr=hp["learning_rate"], weight_decay=hp.get("weight_decay", 0.0))
    return torch.optim.SGD(params, lr=hp["learning_rate"], momentum=hp.get("momentum", 0.0),
                           weight_decay=hp.get("weight_decay", 0.0))


def atomic_save(obj, path: Path) -> None:
    """Write to a temp file, fsync, rename: a crash leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Checkpoints:
    """Atomic checkpoints named by global step, at a step or time interval (else every epoch), keeping
    the last ``keep``; loading falls back past unreadable files to the newest good one."""

    def __init__(self, directory: Path, every_steps: int | None = None, every_minutes: float | None = None,
                 keep: int = 3) -> None:
        self.dir = Path(directory)
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self._last_time = time.monotonic()

    @classmethod
    def from_spec(cls, cfg: RunConfig) -> "Checkpoints":
        c = cfg.spec.get("checkpointing", {})
        return cls(cfg.checkpoint_dir, c.get("every_steps"), c.get("every_minutes"), c.get("keep_last", 3))

    def files(self) -> list[Path]:
        """Newest first."""
        found = [p for p in self.dir.glob("step-*.pt") if CKPT_RE.match(p.name)] if self.dir.exists() else []
        return sorted(found, key=lambda p: int(CKPT_RE.match(p.name).group(1)), reverse=True)

    def due(self, step: int, end_of_epoch: bool) -> bool:
        if self.every_steps:
            return step % self.every_steps == 0
        if self.every_minutes:
            return (time.monotonic() - self._last_time) >= self.every_minutes * 60
        return end_of_epoch

    def save(self, state: dict, step: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step-{step:08d}.pt"
        atomic_save(state, path)
        self._last_time = time.monotonic()
        for old in self.files()[self.keep :]:
            old.unlink(missing_ok=True)
        return path

    def load_latest(self, log=print) -> dict | None:
        for path in self.files():
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
                state["_path"] = path.name
                return state
            except Exception as err:  # noqa: BLE001 - any unreadable file means "try the previous one"
                log(f"checkpoint {path.name} is unreadable ({type(err).__name__}: {err}); trying the previous one")
        return None


def resume_point(state: dict, batches_per_epoch: int, source: str, log) -> tuple[int, int, int]:
    """(epoch, batches to skip in it, global step) to continue from a checkpoint's data position; a
    checkpoint taken after an epoch's last batch continues with the next epoch."""
    epoch, skip, step = state["epoch"], state["batches_done"], state["step"]
    if skip >= batches_per_epoch:
        epoch, skip = epoch + 1, 0
    log(f"resumed from checkpoint {source} at step {step} (epoch {epoch + 1}, batch {skip})")
    return epoch, skip, step


class Tracker:
    """Rank-0 metric sink: MLflow (batched) and TensorBoard."""

    def __init__(self, cfg: RunConfig) -> None:
        self.client = None
        self.writer = None
        if cfg.tracking_uri and cfg.mlflow_run_id:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(cfg.tracking_uri)
            self.run_id = cfg.mlflow_run_id
        if cfg.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(cfg.tensorboard_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k.replace("_", "/", 1), float(v), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Progress:
    """Throughput and ETA for the log."""

    def __init__(self, total_steps: int, start_step: int) -> None:
        self.total, self.start, self.t0 = total_steps, start_step, time.monotonic()

    def line(self, epoch: int, epochs: int, step: int, samples: int, **metrics: float) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        done = step - self.start
        eta = elapsed / done * (self.total - step) if done else float("nan")
        shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return (f"epoch {epoch}/{epochs} step {step}/{self.total} {shown} "
                f"{samples / elapsed:.0f} samples/s ETA {eta:.0f}s")


@dataclass
class Loop:
    """What the DDP and Horovod loops share, with the three points where the strategies differ:
    ``optimize(loss) -> grad norm`` (backward, gradient averaging, optimizer step), ``mean(loss) -> float``
    (the loss averaged over the workers) and ``barrier()``."""

    cfg: RunConfig
    recipe: object
    model: torch.nn.Module  # the plain module: checkpoints, metrics
    forward: torch.nn.Module  # what the loss runs through (the DDP wrapper, or the model itself)
    opt: torch.optim.Optimizer
    sched: object
    sampler: object
    loader: object
    val: object
    device: torch.device
    rank: int
    world: int
    optimize: object
    mean: object
    barrier: object

    def run(self, start_epoch: int, skip: int, step: int, tracker: Tracker | None, log) -> int:
        """Train from (epoch, batches to skip, global step) to the last epoch; returns the final step."""
        hp = self.cfg.spec["hyperparameters"]
        ckpts = Checkpoints.from_spec(self.cfg)
        progress = Progress(hp["epochs"] * len(self.loader), step)
        samples, reduced = 0, float("nan")
        for epoch in range(start_epoch, hp["epochs"]):
            self.sampler.set_epoch(epoch)  # the same permutation after a restart, so skipping resumes the data position
            for i, batch in enumerate(self.loader):
                if epoch == start_epoch and i < skip:
                    continue
                batch = to_device(batch, self.device)
                loss = self.recipe.loss(self.forward, batch)
                norm = self.optimize(loss)
                lr = self.sched.get_last_lr()[0]
                self.sched.step()
                step += 1
                samples += len(batch[0]) * self.world
                reduced = self.mean(loss)
                if tracker:
                    tracker.log({"train_loss": reduced, "train_lr": lr, "train_grad_norm": norm}, step)
                if self.rank == 0 and ckpts.due(step, i + 1 == len(self.loader)):
                    path = ckpts.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                                       "scheduler": self.sched.state_dict(), "rng": torch.get_rng_state(),
                                       "epoch": epoch, "batches_done": i + 1, "step": step}, step)
                    log(f"checkpoint {path.name} saved at step {step}")
                fault_injection(step, self.cfg.out_dir)
            metrics = self.recipe.val_metrics(self.model, self.val, self.device)
            log(progress.line(epoch + 1, hp["epochs"], step, samples, loss=reduced, **metrics))
            if tracker:
                tracker.log({**metrics, "epoch": epoch + 1}, step)
            self.barrier()
        return step


def grad_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> tuple[float, float]:
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(x[i : i + batch]).float()
            loss_sum += float(F.cross_entropy(logits, y[i : i + batch], reduction="sum"))
            correct += int((logits.argmax(1) == y[i : i + batch]).sum())
    model.train(was_training)
    return correct / max(len(x), 1), loss_sum / max(len(x), 1)


def fault_injection(step: int, out_dir: str) -> None:
    """Chaos hook for the resume tests: TRAINYARD_FAIL_ONCE_AT_STEP=N crashes this process hard the first
    time step N is reached in this run directory (a marker file makes it once)."""
    target = os.environ.get("TRAINYARD_FAIL_ONCE_AT_STEP")
    if target and step == int(target):
        marker = Path(out_dir) / f".fault-injected-{target}"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            print(f"[trainer] fault injection: crashing at step {step}", flush=True)
            os._exit(17)


def finish(model: torch.nn.Module, cfg: RunConfig, recipe, val, meta: dict, steps: int, world: int, t0: float,
           tracker: Tracker | None, resumed_from_step: int | None = None) -> dict:
    """Rank 0: the final model file and the result record the train task reads."""
    out_dir = Path(cfg.out_dir)
    atomic_save(recipe.model_blob(model, meta), out_dir / "model.pt")
    metrics = recipe.val_metrics(model, val, next(model.parameters()).device)
    result = {
        "model_path": str(out_dir / "model.pt"),
        "recipe": recipe.name,
        "steps": steps,
        "epochs": cfg.spec["hyperparameters"]["epochs"],
        "world_size": world,
        "strategy": cfg.spec.get("distributed", {}).get("strategy", "ddp"),
        "train_seconds": round(time.time() - t0, 3),
        **metrics,
        "resumed_from_step": resumed_from_step,
    }
    (out_dir / "train_result.json").write_text(json.dumps(result, indent=1))
    if tracker:
        tracker.close()
    return result
