"""The training loop run in every torchrun worker: DDP, per-epoch atomic checkpoints, resume, logging.

Launched as ``torchrun ... -m trainyard.training.entry --config run.json``. Rank 0 alone writes
checkpoints, the final model and the tracking records; every rank trains.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from trainyard.data import formats
from trainyard.training.model import SmallCNN, to_input

CKPT_RE = re.compile(r"^epoch-(\d{4})\.pt$")


@dataclass
class RunConfig:
    """What the train task hands to the workers (written as JSON next to the run's outputs)."""

    spec: dict
    data: dict  # the prepared-data manifest
    out_dir: str
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    tensorboard_dir: str | None = None
    keep_checkpoints: int = 3

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        return cls(**json.loads(Path(path).read_text()))


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoints, newest first."""
    found = [p for p in ckpt_dir.glob("epoch-*.pt") if CKPT_RE.match(p.name)] if ckpt_dir.exists() else []
    return sorted(found, key=lambda p: int(CKPT_RE.match(p.name).group(1)), reverse=True)


def load_latest(ckpt_dir: Path, log) -> dict | None:
    """The newest checkpoint that loads; a corrupt one is reported and skipped."""
    for path in checkpoints(ckpt_dir):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # noqa: BLE001 - any unreadable file means "try the previous one"
            log(f"checkpoint {path.name} is unreadable ({err}); trying the previous one")
    return None


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


def _grad_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> tuple[float, float]:
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(x[i : i + batch])
            loss_sum += float(F.cross_entropy(logits, y[i : i + batch], reduction="sum"))
            correct += int((logits.argmax(1) == y[i : i + batch]).sum())
    model.train()
    return correct / max(len(x), 1), loss_sum / max(len(x), 1)


def train(cfg: RunConfig) -> dict:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[trainer] {msg}", flush=True)

    hp = cfg.spec["hyperparameters"]
    torch.manual_seed(hp["seed"])
    _, y_train, img_train, meta = formats.read(cfg.data["format"], cfg.data["train"])
    _, y_val, img_val, _ = formats.read(cfg.data["format"], cfg.data["val"])
    x_train, x_val = to_input(img_train, meta["pixel_max"]), to_input(img_val, meta["pixel_max"])
    y_train, y_val = torch.from_numpy(y_train), torch.from_numpy(y_val)
    dataset = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=hp["seed"])
    loader = DataLoader(dataset, batch_size=hp["batch_size"], sampler=sampler, drop_last=False)

    model = SmallCNN(len(meta["classes"]), meta["height"], meta["width"]).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None) if dist.is_initialized() else model
    opt = torch.optim.SGD(ddp.parameters(), lr=hp["learning_rate"], momentum=hp["momentum"])
    total_steps = hp["epochs"] * len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1))

    out_dir = Path(cfg.out_dir)
    ckpt_dir = out_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    start_epoch, step = 0, 0
    state = load_latest(ckpt_dir, log)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start_epoch, step = state["epoch"] + 1, state["step"]
        log(f"resumed from checkpoint epoch-{state['epoch']:04d}.pt at step {step}")

    tracker = Tracker(cfg) if rank == 0 else None
    log(
        f"world_size={world} backend={backend} device={device} train={len(dataset)} val={len(x_val)} "
        f"epochs={hp['epochs']} steps/epoch={len(loader)}"
    )
    t0 = time.time()
    samples_seen = 0
    for epoch in range(start_epoch, hp["epochs"]):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = _grad_norm(model)
            opt.step()
            lr = sched.get_last_lr()[0]
            sched.step()
            step += 1
            samples_seen += len(xb) * world
            reduced = loss.detach().clone()
            if dist.is_initialized():
                dist.all_reduce(reduced)  # SUM: gloo has no AVG
                reduced /= world
            if tracker:
                tracker.log({"train_loss": float(reduced), "train_lr": lr, "train_grad_norm": grad_norm}, step)
        val_acc, val_loss = evaluate(model, x_val.to(device), y_val.to(device))
        elapsed = time.time() - t0
        done = epoch + 1 - start_epoch
        eta = elapsed / done * (hp["epochs"] - epoch - 1)
        log(
            f"epoch {epoch + 1}/{hp['epochs']} step {step}/{total_steps} loss {float(reduced):.4f} "
            f"val_accuracy {val_acc:.4f} val_loss {val_loss:.4f} {samples_seen / elapsed:.0f} samples/s ETA {eta:.0f}s"
        )
        if rank == 0:
            tracker.log({"val_accuracy": val_acc, "val_loss": val_loss, "epoch": epoch + 1}, step)
            atomic_save(
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "rng": torch.get_rng_state(),
                    "epoch": epoch,
                    "step": step,
                },
                ckpt_dir / f"epoch-{epoch:04d}.pt",
            )
            for old in checkpoints(ckpt_dir)[cfg.keep_checkpoints :]:
                old.unlink(missing_ok=True)
        if dist.is_initialized():
            dist.barrier()

    result = {}
    if rank == 0:
        atomic_save({"config": model.config, "state_dict": model.state_dict()}, out_dir / "model.pt")
        val_acc, val_loss = evaluate(model, x_val.to(device), y_val.to(device))
        result = {
            "model_path": str(out_dir / "model.pt"),
            "steps": step,
            "epochs": hp["epochs"],
            "world_size": world,
            "train_seconds": round(time.time() - t0, 3),
            "val_accuracy": val_acc,
            "val_loss": val_loss,
        }
        (out_dir / "train_result.json").write_text(json.dumps(result, indent=1))
        tracker.close()
        log(f"done: {json.dumps(result)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return result
