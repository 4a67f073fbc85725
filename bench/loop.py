"""trainyard's worker loop against a hand-written PyTorch loop, on the digits defaults.

Both sides train the digits recipe's SmallCNN on the same prepared split with the JobSpec defaults
(batch 32, SGD lr 0.1 momentum 0.9, cosine schedule, validation after each epoch), on 1 and on 2
processes (torchrun, gloo), for 20 epochs: the JobSpec's 10 twice, so each run's start-up (about 11 s)
buys twice the epochs measured; the steps are the same, the schedule only stretches. trainyard runs as
in production: ``torchrun -m trainyard.training.entry`` with rank 0 writing the metrics file that this
process relays to MLflow on SQLite and TensorBoard, as the local launcher does.

The machines these run on are shared: another tenant's load slows a run by 10-30 % for seconds at a
time, which moves a whole run's throughput more than the difference measured. So the repetitions rotate
the order of the sides (each goes first, second and third in turn), and the first figure is the median
epoch of each side, over every whole epoch of all its runs: an epoch is its steps and rank 0's validation
(trainyard's also its checkpoint, which the hand loop does not write), timed by trainyard's loop itself
(its ``epoch_seconds`` curve, read from the metrics file) and at the same point by the hand loop. A burst
of interference slows a few epochs, which move a median little and a whole run's mean much. The fastest
epoch of each side follows (interference only ever slows an epoch), then the whole loop's samples per
second (first step to last validation, the same span on both sides: process start-up and imports are not
the loop), as medians, with each repetition's trainyard / hand ratio.

Per process count it also prints, from the same runs and a third side (trainyard with tracking off):

- start-up and exit: the torchrun command's wall time less its epoch loop, trainyard against the hand
  script (imports, data loading, model build, the final model and result files, process exit);
- tracking overhead: trainyard's samples/s with the metrics file and its relay against none at all;
- checkpoint stall: the training thread's time in checkpoint saves (the write to disk is a background
  thread's), per save against one step's time, and as a share of the loop.

    .venv/bin/python bench/loop.py [--reps 7] [--procs 1 2] [--epochs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def hand_worker(data: dict, out: Path, epochs: int) -> None:
    """What someone would write by hand: DataLoader + DistributedSampler, DDP, SGD, cosine, eval per epoch."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from trainyard.recipes.base import read_split
    from trainyard.training.model import SmallCNN, to_input

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(42)

    def xy(split):
        _, labels, images, meta, _ = read_split(data, split)
        return to_input(images, meta["pixel_max"]), torch.from_numpy(labels), meta

    x, y, meta = xy("train")
    xv, yv, _ = xy("val")
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=42)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = SmallCNN(len(meta["classes"]), meta["height"], meta["width"])
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(loader))
    samples = 0
    t0 = time.perf_counter()
    epoch_seconds = []  # rank 0's, up to its validation: where trainyard's loop times its epochs
    for epoch in range(epochs):
        epoch_t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            samples += len(xb) * world
        if rank == 0:
            model.eval()
            with torch.no_grad():
                acc = float((model(xv).argmax(1) == yv).float().mean())
            model.train()
            epoch_seconds.append(time.perf_counter() - epoch_t0)
        if world > 1:
            dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        result = {
            "samples_per_second": samples / elapsed,
            "loop_seconds": elapsed,
            "epoch_seconds": epoch_seconds,
            "val_accuracy": acc,
        }
        out.write_text(json.dumps(result))
    if world > 1:
        dist.destroy_process_group()


def prepare(root: Path) -> dict:
    from trainyard.data.classification import digits_files
    from trainyard.data.prepare import prepare_classification

    files = root / "digits"
    for rel, blob in digits_files().items():
        (files / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / rel).write_bytes(blob)
    return prepare_classification(files, "b" * 64, root / "prepared", 0.2, 0)


def mlflow_run(root: Path) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("bench", artifact_location=str(root / "artifacts"))
    return uri, client.create_run(exp).info.run_id


@dataclass(frozen=True)
class Run:
    samples_per_second: float
    loop_s: float
    wall_s: float  # the torchrun command, start to exit
    steps: int = 0
    stall_s: float = 0.0  # the training thread's time in checkpoint saves
    checkpoints: int = 0
    epochs_s: tuple[float, ...] = ()  # each whole epoch: its steps, checkpoint (trainyard's) and validation

    @property
    def outside_s(self) -> float:
        """Start-up and exit: all of the command but its epoch loop."""
        return self.wall_s - self.loop_s


def torchrun(nproc: int, tail: list[str], env: dict) -> float:
    """Run the command; its wall time in seconds."""
    from trainyard.training.launchers.local import worker_env

    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        *tail,
    ]
    started = time.perf_counter()
    env = worker_env(nproc, {**os.environ, **env})
    # a session of its own, as the local launcher starts the workers: with the kernel's autogroup on, the
    # workers are then a scheduling group apart from this process and its relay thread
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, start_new_session=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def trainyard_once(
    root: Path, data: dict, nproc: int, uri: str, run_id: str, rep: int, epochs: int, tracking: bool = True
) -> Run:
    from mlflow.tracking import MlflowClient

    from trainyard.spec import parse_spec
    from trainyard.training.metrics import LiveRelay, metrics_path, read_metrics
    from trainyard.training.run_config import RunConfig, work_dir

    out = root / f"ty-{nproc}-{rep}-{'tracked' if tracking else 'untracked'}"
    out.mkdir()
    spec = parse_spec({"resources": {"gpus_per_node": nproc}, "hyperparameters": {"epochs": epochs}})  # digits
    # as the local launcher runs it: rank 0 writes the metrics file, this process relays it to MLflow
    work = Path(work_dir(str(out)))
    metrics_file = str(metrics_path(out)) if tracking else None
    config = RunConfig(spec=spec, data=data, out_dir=str(work), metrics_file=metrics_file).dump(out / "run.json")
    argv = ["-m", "trainyard.training.entry", "--config", str(config)]
    if tracking:
        with LiveRelay(out, MlflowClient(uri), run_id, str(out / "tb"), on_line=lambda line: None):
            wall = torchrun(nproc, argv, {})
    else:
        wall = torchrun(nproc, argv, {})
    result = json.loads((work / "train_result.json").read_text())
    # the loop's own epoch timings: its epoch_seconds curve (tracked runs only)
    epochs_s = tuple(v for _, name, v in read_metrics(metrics_file) if name == "epoch_seconds") if metrics_file else ()
    return Run(
        result["samples_per_second"],
        result["loop_seconds"],
        wall,
        result["steps"],
        result["checkpoint_stall_seconds"],
        result["checkpoints"],
        epochs_s,
    )


def hand_once(root: Path, data: dict, nproc: int, rep: int, epochs: int) -> Run:
    out = root / f"hand-{nproc}-{rep}.json"
    (root / "data.json").write_text(json.dumps(data))
    argv = [str(Path(__file__).resolve()), "--hand-worker", str(root / "data.json"), str(out), str(epochs)]
    wall = torchrun(nproc, argv, {})
    result = json.loads(out.read_text())
    return Run(result["samples_per_second"], result["loop_seconds"], wall, epochs_s=tuple(result["epoch_seconds"]))


def report(nproc: int, epochs: int, hand: list[Run], ty: list[Run], untracked: list[Run]) -> str:
    """The lines of one process count: the ratios first (what BENCHMARKS.md and the goal quote)."""
    med = statistics.median

    def speeds(runs: list[Run]) -> list[int]:
        return [round(r.samples_per_second) for r in runs]

    h, t, u = (med(r.samples_per_second for r in runs) for runs in (hand, ty, untracked))
    paired = sorted(b.samples_per_second / a.samples_per_second for a, b in zip(hand, ty, strict=True))
    epochs_h, epochs_t = ([e for r in runs for e in r.epochs_s] for runs in (hand, ty))
    if len(epochs_h) != len(epochs_t) or not epochs_t:
        raise SystemExit(f"epoch timings: hand {len(epochs_h)}, trainyard {len(epochs_t)}: expected as many, > 0")
    typical_h, typical_t = med(epochs_h), med(epochs_t)
    best_h, best_t = min(epochs_h), min(epochs_t)
    step_ms = med(r.loop_s / r.steps for r in ty) * 1000
    saves = med(r.checkpoints for r in ty)
    stall_ms = med(r.stall_s / r.checkpoints for r in ty if r.checkpoints) * 1000 if saves else 0.0
    share = med(r.stall_s / r.loop_s for r in ty)
    outside_h, outside_t = med(r.outside_s for r in hand), med(r.outside_s for r in ty)
    return "\n".join(
        [
            f"{nproc} process(es): median epoch: hand {typical_h * 1000:.1f} ms  trainyard {typical_t * 1000:.1f} ms  "
            f"ratio {typical_h / typical_t:.3f}x (of all {len(epochs_t)} epochs a side: {len(ty)} runs x {epochs})",
            f"  fastest epoch: hand {best_h * 1000:.1f} ms  trainyard {best_t * 1000:.1f} ms  "
            f"ratio {best_h / best_t:.3f}x",
            f"  whole loop: hand {h:.0f} samples/s  trainyard {t:.0f} samples/s  ratio {t / h:.3f}x  "
            f"(medians; paired ratios {[round(p, 3) for p in paired]}; hand {speeds(hand)}, trainyard {speeds(ty)})",
            f"  start-up + exit (wall - loop): hand {outside_h:.2f} s  trainyard {outside_t:.2f} s  "
            f"({outside_t - outside_h:+.2f} s)",
            f"  tracking: on {t:.0f} samples/s  off {u:.0f} samples/s  overhead {1 - t / u:+.1%}  "
            f"(off: {speeds(untracked)})",
            f"  checkpoints: {saves:.0f} a run, {stall_ms:.2f} ms stall each = {stall_ms / step_ms:.2f} steps "
            f"({step_ms:.2f} ms a step); {share:.2%} of the loop",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of each run (the JobSpec's default is 10)")
    parser.add_argument("--hand-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_worker:
        data, out, epochs = args.hand_worker
        hand_worker(json.loads(Path(data).read_text()), Path(out), int(epochs))
        return
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        root = Path(tmp)
        data = prepare(root)
        uri, run_id = mlflow_run(root)
        for nproc in args.procs:
            sides: dict[str, list[Run]] = {"hand": [], "tracked": [], "untracked": []}
            order = list(sides)
            for rep in range(args.reps):
                for side in order[rep % 3 :] + order[: rep % 3]:  # each side first, second, third in turn
                    if side == "hand":
                        sides[side].append(hand_once(root, data, nproc, rep, args.epochs))
                    else:
                        tracked = side == "tracked"
                        sides[side].append(trainyard_once(root, data, nproc, uri, run_id, rep, args.epochs, tracked))
            print(report(nproc, args.epochs, *sides.values()), flush=True)


if __name__ == "__main__":
    main()
