"""trainyard's worker loop against a hand-written PyTorch loop, on the digits defaults, epoch by epoch in turns.

Both sides train the digits recipe's SmallCNN on the same prepared split with the JobSpec defaults
(batch 32, SGD lr 0.1 momentum 0.9, cosine schedule, a checkpoint and validation after each epoch), on 1
and on 2 processes (torchrun, gloo). trainyard runs as in production: ``torchrun -m trainyard.training.entry``
with rank 0 writing the metrics file that a relay process sends to MLflow on SQLite and TensorBoard, as
the local launcher's relay does; a third side is trainyard with tracking off.

The machines these run on are shared, and their speed moves under the work: the same pure-Python loop
takes 10.7 ms or 20 ms on one core, from one tenth of a second to the next (2026-12-02). Whole runs of one
side and then the other, each about 15 s, gave ratios that moved by ±12 % between runs of the same code.
So the sides run at once and take turns. Each repetition (one run of each side) starts the three commands
one after the other, each alone, and pauses each at the end of its first epoch: SIGSTOP to the command and
every process it started. Then, round after round, each side in turn is resumed for one epoch and paused
again when rank 0 prints that epoch's line (both loops print it after the epoch's validation, before the
barrier). This process times each such epoch from the resume to the line, with the other sides paused,
and the three epochs of a round lie within a second of each other. Each round's trainyard / hand speed
ratio is one pair. The figure is the median pair, with a 95 % interval from a bootstrap that redraws
blocks of consecutive rounds (interference lasts seconds, so neighbouring rounds are not independent),
and a verdict on the goal of 0.97x.

What an epoch holds, on both sides: its steps, rank 0's checkpoint and validation, and the end of the
epoch before it that came after that epoch's line (trainyard's ``tracker.log``, the barrier). The hand loop
writes its checkpoint with a plain ``torch.save``, over one file, without fsync; trainyard serialises it
into memory and a background thread writes, fsyncs, renames and prunes it (keeping 3). Until 8807e0f the
hand loop wrote none, and trainyard's checkpoint was charged to it alone; the report gives the ratio
without either side's save too. The hand loop reads its batches as most people write it (a
``TensorDataset``: 32 items fetched and stacked a batch), trainyard reads a batch in one go. The first
epoch of each run is the warm-up, not measured. The thread that reads a side's output pauses it as it reads
the line: between the line and the pause a side runs on for a fraction of a millisecond that no side is
charged, the same for all. On a machine busy enough to keep that thread waiting a whole epoch, the side's
next line comes before its resume (a negative epoch, once seen beside the test suite): the repetition is
run again, at most three times.
Timers of wall time keep running while a side is paused, and trainyard has two: its relay passes every
5 s, so here it passes every 15 s (trainyard runs a third of the time); the worker's tracker thread wakes
every 5 s of wall time, so here up to three times as often per epoch as in production, a bias against
trainyard.

Per process count it also prints, from the same runs:

- the median epoch of each side and its samples/s;
- start-up, warm-up and exit: each command's time to its first epoch's line less its median epoch, plus
  its time from the last resume to its exit (imports, data loading, model build, the first epoch's extra
  time, the result file, process exit; trainyard also writes the final model and validates it once more),
  trainyard against the hand script;
- tracking overhead: the tracked and untracked sides' epochs of the same rounds, paired the same way;
- without the checkpoints: the same pairs, each side's epochs less its training thread's time in its save
  (the hand loop's whole ``torch.save``, as its epoch line reports it; trainyard's stall, its mean over all
  its saves, the warm-up's included, as its result record gives only the sum). trainyard's background
  write stays in its epochs, a bias against it;
- checkpoint stall: trainyard's training thread's time in checkpoint saves (the write to disk is a
  background thread's, paused and resumed with its process), the mean per save against an epoch's time
  per step, and per epoch; beside it the hand loop's ``torch.save``, the median of the measured epochs'.

The tracked side also writes the per-layer histograms of weights and gradients, every
``--histogram-every`` steps (the JobSpec's default unless told; 0: none).

    .venv/bin/python bench/loop.py [--reps 8] [--procs 1 2] [--epochs 100] [--histogram-every N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

GOAL = 0.97  # trainyard's samples/s against the hand loop's (issue 10)
SIDES = ("hand", "tracked", "untracked")
EPOCH_LINE = re.compile(r"\bepoch \d+/\d+ step ")  # trainyard's progress line; the hand worker prints one too
RELAY_EVERY_S = 5.0 * len(SIDES)  # the launcher's relay passes every 5 s; here trainyard runs a third of the time
SCRIPT = str(Path(__file__).resolve())  # what torchrun and the relay process run, from any directory
CHECKPOINT_MS = re.compile(r"\bcheckpoint_ms ([\d.]+)")  # the hand loop's save, on its epoch line
BLOCK = 8  # rounds per block of the bootstrap: about 6 s, longer than most bursts of interference


def hand_worker(data: PreparedData, out: Path, epochs: int) -> None:
    """What someone would write by hand for the same job: DataLoader + DistributedSampler, DDP, SGD, cosine;
    after each epoch, rank 0 saves a checkpoint (``torch.save`` of model, optimizer and schedule, over one
    file, no fsync) and computes the validation accuracy and loss, as the JobSpec's defaults ask of
    trainyard. Its epoch line gives the save's time (``checkpoint_ms``) for the report."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from trainyard.recipes.shared import read_split
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
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            samples += len(xb) * world
        if rank == 0:
            saving = time.perf_counter()
            state = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "epoch": epoch + 1,
            }
            torch.save(state, out.parent / "checkpoint.pt")
            save_ms = (time.perf_counter() - saving) * 1000
            model.eval()
            with torch.no_grad():
                logits = model(xv)
                acc, val_loss = float((logits.argmax(1) == yv).float().mean()), float(F.cross_entropy(logits, yv))
            model.train()
            metrics = f"val_accuracy {acc:.4f} val_loss {val_loss:.4f} checkpoint_ms {save_ms:.3f}"
            print(f"epoch {epoch + 1}/{epochs} step {(epoch + 1) * len(loader)} {metrics}", flush=True)
        if world > 1:
            dist.barrier()
    if rank == 0:
        out.write_text(json.dumps({"samples": samples, "val_accuracy": acc}))
    if world > 1:
        dist.destroy_process_group()


def prepare(root: Path) -> PreparedData:
    from trainyard.data.classification import digits_files
    from trainyard.recipes.digits import prepare_classification

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


def relay_worker(run_dir: str, uri: str, run_id: str, tensorboard_dir: str) -> None:
    """The tracked side's relay, as the local launcher runs it beside the workers, in a process of its own
    so that it is paused with them: its passes run in trainyard's turns, not in the hand loop's."""
    from mlflow.tracking import MlflowClient

    from trainyard.training.metrics import LiveRelay

    with LiveRelay(run_dir, MlflowClient(uri), run_id, tensorboard_dir, on_line=print, every_s=RELAY_EVERY_S):
        print("relaying", flush=True)
        sys.stdin.read()  # until the bench closes it, when the workers have exited


class Job:
    """A command whose output this process reads line by line (``marker`` lines are timed as they come), and
    which it pauses and resumes whole: the command and the processes it started (torchrun starts each worker
    in a session of its own), as found at the first pause; these commands start none after their first
    epoch (the digits JobSpec's loader has no worker processes)."""

    def __init__(self, argv: list[str], env: dict, marker: re.Pattern, pause_at_marks: bool = False) -> None:
        self.marker = marker
        self.pause_at_marks = pause_at_marks  # each marker line pauses the command as it is read
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.marks: queue.Queue[float | None] = queue.Queue()
        self.marked: list[str] = []  # the marker lines, in order
        self.tail: deque[str] = deque(maxlen=60)
        self.processes: list = []  # psutil.Process: a signal never reaches another process given a freed pid
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.marker.search(line):
                at = time.perf_counter()
                if self.pause_at_marks:
                    self.send(signal.SIGSTOP)
                self.marked.append(line)  # before its time is handed out: whoever reads the time finds it
                self.marks.put(at)
            self.tail.append(line)
        self.marks.put(None)

    def output(self) -> str:
        self.reader.join(timeout=10)  # the rest of a dead command's output, traceback included
        return f"{' '.join(self.proc.args)}:\n{''.join(self.tail)}"

    def next_mark(self, timeout_s: float = 600.0) -> float:
        """When the command's next marker line came."""
        try:
            at = self.marks.get(timeout=timeout_s)
        except queue.Empty:
            at = None
        if at is None:
            raise SystemExit(f"no line like {self.marker.pattern!r} from {self.output()}")
        return at

    def send(self, sig: int) -> None:
        import psutil

        if not self.processes:  # found once, when its processes are all up (at its first pause)
            with contextlib.suppress(psutil.NoSuchProcess):
                command = psutil.Process(self.proc.pid)
                self.processes = [command, *command.children(recursive=True)]
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)

    def finish(self, timeout_s: float = 600.0) -> None:
        """Wait for the command's exit; a failure stops the bench with its output."""
        if self.proc.stdin:
            self.proc.stdin.close()
        if self.proc.wait(timeout_s) != 0:
            raise SystemExit(f"failed: {self.output()}")

    def kill(self) -> None:
        """The command and its processes, paused or not (a no-op for those that have exited)."""
        self.send(signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()


@dataclass
class Side:
    """One side of a repetition: its torchrun command, and the relay for the tracked side."""

    job: Job
    result: Path  # the side's result record
    relay: Job | None = None
    epochs_s: list[float] = field(default_factory=list)  # each measured epoch: resume to its line
    first_s: float = 0.0  # start to the first epoch's line
    exit_s: float = 0.0  # last resume to exit

    @property
    def jobs(self) -> list[Job]:
        return [self.job, *([self.relay] if self.relay else [])]

    def pause(self) -> None:
        for job in self.jobs:
            job.send(signal.SIGSTOP)

    def resume(self) -> None:
        for job in self.jobs:
            job.send(signal.SIGCONT)

    def kill(self) -> None:
        for job in self.jobs:
            with contextlib.suppress(Exception):  # every job gets its kill, whatever one of them raises
                job.kill()

    @functools.cached_property
    def record(self) -> dict:
        """The side's result record, read once (the report asks after the command has exited)."""
        return json.loads(self.result.read_text())

    def samples_per_epoch(self, epochs: int) -> float:
        record = self.record
        if "samples" in record:  # the hand loop's
            return record["samples"] / epochs
        return record["samples_per_second"] * record["loop_seconds"] / epochs

    def saves_s(self, epochs: int) -> list[float]:
        """The checkpoint save in each measured epoch, on the training thread: the hand loop's from its epoch
        lines; trainyard's stall, its mean per epoch (the worker does not print each save's)."""
        record = self.record
        if "samples" in record:  # the hand loop's: its first line is the warm-up's
            lines = self.job.marked[1 : len(self.epochs_s) + 1]
            saves = [CHECKPOINT_MS.search(line) for line in lines]
            if not all(saves):
                raise SystemExit(f"a hand loop epoch line without {CHECKPOINT_MS.pattern!r}: {self.job.output()}")
            return [float(match.group(1)) / 1000 for match in saves if match]
        return [record["checkpoint_stall_seconds"] / epochs] * len(self.epochs_s)

    @property
    def outside_s(self) -> float:
        """Start-up, warm-up and exit: the command's time to its first epoch's end less its median epoch,
        and its time after its last epoch's end."""
        return self.first_s - statistics.median(self.epochs_s) + self.exit_s


def torchrun(nproc: int, tail: list[str]) -> Job:
    from trainyard.training.launchers.local import worker_env

    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={nproc}"]
    return Job([*argv, *tail], worker_env(nproc, dict(os.environ)), EPOCH_LINE, pause_at_marks=True)


def start(side: str, out: Path, nproc: int, epochs: int, mlflow: tuple[str, str], histogram_every: int) -> Side:
    """Start one side's command, writing into ``out`` (the tracked side's relay first, as the local launcher
    enters it); the tracked side writes histograms every ``histogram_every`` steps, as a local run does (0:
    none)."""
    from trainyard.spec import parse_spec
    from trainyard.training.metrics import metrics_path
    from trainyard.training.run_config import RunConfig, work_dir

    root = out.parent
    if side == "hand":
        argv = [SCRIPT, "--hand-worker", str(root / "data.json"), str(out / "result.json"), str(epochs)]
        return Side(torchrun(nproc, argv), out / "result.json")
    spec = parse_spec(  # digits
        {
            "resources": {"gpus_per_node": nproc},
            "hyperparameters": {"epochs": epochs},
            "tracking": {"histogram_every_steps": histogram_every},
        }
    )
    work = Path(work_dir(str(out)))
    work.mkdir()  # as the launchers make it
    tracked = side == "tracked"
    metrics_file = str(metrics_path(out)) if tracked else None
    histogram_dir = str(work / "tensorboard") if tracked else None  # as plan_training sets it
    from trainyard.data.prepare import PreparedData

    data = PreparedData.model_validate_json((root / "data.json").read_text())
    config = RunConfig(
        spec=spec, data=data, out_dir=str(work), metrics_file=metrics_file, histogram_dir=histogram_dir
    ).dump(out / "run.json")
    relay = None
    if side == "tracked":
        relay = Job(
            [sys.executable, SCRIPT, "--relay", str(out), *mlflow, str(out / "tb")],
            dict(os.environ),
            re.compile("^relaying"),
        )
        try:
            relay.next_mark()
        except BaseException:
            relay.kill()
            raise
    return Side(
        torchrun(nproc, ["-m", "trainyard.training.entry", "--config", str(config)]), work / "train_result.json", relay
    )


class RanPastPause(Exception):
    """A side's epoch line came before its resume: it trained on while it should have been paused."""


def repetition(
    root: Path, nproc: int, rep: int, epochs: int, mlflow: tuple[str, str], histogram_every: int, attempt: int = 0
) -> dict[str, Side]:
    """One run of each side, their epochs in turns; the sides' order rotates with the repetition and the
    round, so that each side goes first, second and third in turn. RanPastPause where a side was not
    paused in time (``attempt``: the how-manyth try of this repetition, for its folders)."""

    def rotated(k: int) -> list[str]:
        return [*SIDES[k % 3 :], *SIDES[: k % 3]]

    sides: dict[str, Side] = {}
    try:
        for name in rotated(rep):  # each starts alone: the sides before it are paused
            out = root / f"{name}-{nproc}-{rep}-{attempt}"
            out.mkdir()
            side = sides[name] = start(name, out, nproc, epochs, mlflow, histogram_every)
            side.first_s = side.job.next_mark() - side.job.started
            side.pause()
        for round_ in range(1, epochs):
            for name in rotated(rep + round_):
                side = sides[name]
                resumed = time.perf_counter()
                side.resume()
                came = side.job.next_mark()
                side.pause()
                if came < resumed:
                    raise RanPastPause(
                        f"{name}'s epoch {round_ + 1} line came {resumed - came:.3f} s before its resume"
                    )
                side.epochs_s.append(came - resumed)
        for name in rotated(rep):  # each ends alone
            side = sides[name]
            resumed = time.perf_counter()
            side.resume()
            side.job.finish()
            side.exit_s = time.perf_counter() - resumed
            if side.relay:
                side.relay.finish()  # its last pass, after the workers' exit as in the launcher
    finally:
        for side in sides.values():
            side.kill()
    return sides


def median_interval(runs: list[list[float]], draws: int = 2000) -> tuple[float, float, float]:
    """The median of the pairs (``runs``: each run's, round by round) and its 95 % interval from a moving
    block bootstrap: blocks of ``BLOCK`` consecutive rounds of one run, drawn again with replacement."""
    pairs = [p for run in runs for p in run]
    blocks = [run[i : i + BLOCK] for run in runs for i in range(max(len(run) - BLOCK, 0) + 1)]
    rng = random.Random(0)
    medians = []
    for _ in range(draws):
        drawn: list[float] = []
        while len(drawn) < len(pairs):
            drawn += rng.choice(blocks)
        medians.append(statistics.median(drawn[: len(pairs)]))
    medians.sort()
    return statistics.median(pairs), medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def verdict(low: float, high: float) -> str:
    if low >= GOAL:
        return f"goal {GOAL}x met (the interval is above it)"
    if high < GOAL:
        return f"goal {GOAL}x missed (the interval is below it)"
    return f"goal {GOAL}x not shown (the interval holds it)"


def report(nproc: int, epochs: int, runs: list[dict[str, Side]]) -> str:
    """The lines of one process count: the ratio and its verdict first (what BENCHMARKS.md and the goal quote)."""
    med = statistics.median

    def epochs_s(side: Side, less_saves: bool) -> list[float]:
        if not less_saves:
            return side.epochs_s
        return [t - saved for t, saved in zip(side.epochs_s, side.saves_s(epochs), strict=True)]

    def paired(a: str, b: str, less_saves: bool = False) -> list[list[float]]:
        """Per run, round by round: side ``b``'s samples/s against side ``a``'s (``less_saves``: each
        epoch less that side's checkpoint save)."""
        pairs = []
        for run in runs:
            samples_a, samples_b = run[a].samples_per_epoch(epochs), run[b].samples_per_epoch(epochs)
            times = zip(epochs_s(run[a], less_saves), epochs_s(run[b], less_saves), strict=True)
            pairs.append([(samples_b / tb) / (samples_a / ta) for ta, tb in times])
        return pairs

    pairs = paired("hand", "tracked")
    ratio, low, high = median_interval(pairs)
    on_off, on_off_low, on_off_high = median_interval(paired("untracked", "tracked"))
    bare, bare_low, bare_high = median_interval(paired("hand", "tracked", less_saves=True))
    hand_save_ms = med(s for run in runs for s in run["hand"].saves_s(epochs)) * 1000
    epoch_ms = {name: med(s for run in runs for s in run[name].epochs_s) * 1000 for name in SIDES}
    per_second = {
        name: med(run[name].samples_per_epoch(epochs) for run in runs) / epoch_ms[name] * 1000 for name in SIDES
    }
    outside = {name: med(run[name].outside_s for run in runs) for name in SIDES}
    records = [run["tracked"].record for run in runs]
    saves = med(r["checkpoints"] for r in records)
    stalls = [r["checkpoint_stall_seconds"] / r["checkpoints"] for r in records if r["checkpoints"]]
    stall_ms = med(stalls) * 1000 if stalls else 0.0
    step_ms = epoch_ms["tracked"] / (records[0]["steps"] / epochs)  # an epoch's time per step
    return "\n".join(
        [
            f"{nproc} process(es): trainyard {ratio:.3f}x the hand loop's samples/s (median of "
            f"{sum(map(len, pairs))} epoch pairs, 95% interval {low:.3f}-{high:.3f}x): {verdict(low, high)}",
            f"  median epoch: hand {epoch_ms['hand']:.1f} ms ({per_second['hand']:.0f} samples/s)  trainyard "
            f"{epoch_ms['tracked']:.1f} ms ({per_second['tracked']:.0f} samples/s)  ({len(runs)} runs x "
            f"{epochs - 1} epochs a side, in turns)",
            f"  start-up, warm-up and exit: hand {outside['hand']:.2f} s  trainyard {outside['tracked']:.2f} s  "
            f"({outside['tracked'] - outside['hand']:+.2f} s)",
            f"  tracking: on {on_off:.3f}x off's samples/s, overhead {1 - on_off:+.1%} (95% interval "
            f"{1 - on_off_high:+.1%} to {1 - on_off_low:+.1%}; off: median epoch {epoch_ms['untracked']:.1f} ms)",
            f"  without the checkpoints (each side's epochs less its own save): trainyard {bare:.3f}x the hand "
            f"loop's samples/s (95% interval {bare_low:.3f}-{bare_high:.3f}x)",
            f"  checkpoints: {saves / epochs:.0f} an epoch, {stall_ms:.2f} ms stall each = {stall_ms / step_ms:.2f} "
            f"steps ({step_ms:.2f} ms a step); {stall_ms * saves / epochs / epoch_ms['tracked']:.2%} of an epoch; "
            f"the hand loop's torch.save {hand_save_ms:.2f} ms",
        ]
    )


def main() -> None:
    from trainyard.spec import Tracking

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=8, help="runs of each side (4 leave an interval 3 points wide)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=100, help="epochs of each run, the first not measured")
    parser.add_argument(
        "--histogram-every",
        type=int,
        default=Tracking().histogram_every_steps,
        help="the tracked side's tracking.histogram_every_steps (default: the JobSpec's; 0: no histograms)",
    )
    parser.add_argument("--hand-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_worker:
        data, out, epochs = args.hand_worker
        from trainyard.data.prepare import PreparedData

        hand_worker(PreparedData.model_validate_json(Path(data).read_text()), Path(out), int(epochs))
        return
    if args.relay:
        relay_worker(*args.relay)
        return
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (each run's first epoch is not measured)")
    # a SIGTERM (a timeout's) unwinds through the repetitions' clean-up: no paused process is left behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        root = Path(tmp)
        (root / "data.json").write_text(prepare(root).model_dump_json())
        mlflow = mlflow_run(root)
        for nproc in args.procs:
            runs = [
                repetition_retried(root, nproc, rep, args.epochs, mlflow, args.histogram_every)
                for rep in range(args.reps)
            ]
            print(report(nproc, args.epochs, runs), flush=True)


TRIES = 3  # of a repetition where a side ran past its pause


def repetition_retried(
    root: Path, nproc: int, rep: int, epochs: int, mlflow: tuple[str, str], histogram_every: int
) -> dict[str, Side]:
    """The repetition ``rep``, run again where a side ran past its pause (at most ``TRIES`` times)."""
    for attempt in range(TRIES):
        try:
            return repetition(root, nproc, rep, epochs, mlflow, histogram_every, attempt)
        except RanPastPause as err:
            print(f"repetition {rep + 1}, {nproc} process(es): {err} (a busy machine); run again", file=sys.stderr)
    raise SystemExit(
        f"repetition {rep + 1}: a side ran past its pause in each of {TRIES} tries; a machine this busy "
        "cannot time epochs"
    )


if __name__ == "__main__":
    main()
