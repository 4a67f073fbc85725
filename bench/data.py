"""The trainer's data path: memory against dataset size, and the loader against the trainer's consumption.

An MNIST-shaped split (28x28 grayscale, ``--samples`` records, about 0.8 KB each) is written at 1x, 4x and
16x in each record format. For every size, a fresh process builds the digits recipe's train dataset as a
worker does (``recipe.load``) and reads one epoch of rank 0 of 2 through the trainer's DataLoader
(``ShardSampler``, batch 32), twice: streamed from the file (``dataset.memory_cache_mb: 0``) and held in
memory (a cache large enough; held once, and twice for a moment while it is read in chunks). Printed:
its peak anonymous memory (sampled every 5 ms; file pages that
LMDB maps are the kernel's reclaimable cache, not the process's) and the loader's samples/s. In the same
run, the trainer's consumption: samples/s of the digits model's training steps (forward, backward, SGD) at
the same batch size on batches already in memory. The loader must outrun the consumption.

Last, a split a quarter bigger than ``--limit-mb`` trains one epoch through the real worker (torchrun and
one process: about 550 MB of that is theirs) in a memory cgroup of that size: streamed it trains; held in
memory the kernel kills it. That part needs
root and a writable cgroup tree, and says so when it is skipped.

    .venv/bin/python bench/data.py [--samples 15000] [--scales 1 4 16] [--formats lmdb tfrecord] [--workers 0 1]
                                   [--limit-mb 640]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

from child_process import child_result

BATCH = 32


def anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class PeakMemory:
    """The process's largest anonymous RSS while it runs, sampled by a thread."""

    def __init__(self) -> None:
        self.peak = anon_kb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, anon_kb())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_kb())


def write_split(path: Path, fmt: str, samples: int) -> None:
    import numpy as np

    from trainyard.data import formats

    rng = np.random.default_rng(0)
    meta = {"pixel_max": 255, "classes": [str(c) for c in range(10)], "height": 28, "width": 28}
    records = ((f"s{i:08d}", i % 10, rng.integers(0, 256, (28, 28), dtype=np.uint8)) for i in range(samples))
    formats.write(fmt, path, records, meta)


def split_files(fmt: str, train: Path, val: Path, samples: dict[str, int]) -> PreparedData:
    """The record of a train and a val split that write_split wrote (``samples``: each one's count), as the
    trainer's data path reads a prepared commit's."""
    from trainyard.data.prepare import PreparedData

    return PreparedData(
        commit="b" * 64,
        format=fmt,
        val_fraction=samples["val"] / (samples["train"] + samples["val"]),
        test_fraction=0.0,
        seed=0,
        counts=samples,
        path=str(train.parent),
        train=str(train),
        val=str(val),
    )


def child(data_json: str, cache_mb: int, workers: int) -> None:
    """One epoch of rank 0 of 2 through the trainer's data path; prints JSON."""
    import torch
    from torch.utils.data import DataLoader

    from trainyard import recipes
    from trainyard.data.prepare import PreparedData
    from trainyard.spec import parse_spec
    from trainyard.training.data import ShardSampler, already_batched
    from trainyard.training.run_config import RunConfig

    data = PreparedData.model_validate_json(data_json)
    spec = parse_spec({"dataset": {"memory_cache_mb": cache_mb, "loader_workers": workers}})
    base = anon_kb()
    with PeakMemory() as peak:
        t0 = time.perf_counter()
        dataset, _, _ = recipes.get("digits_cnn").load(RunConfig(spec=spec, data=data, out_dir="."))
        sampler = ShardSampler(dataset, world=2, rank=0, seed=0)
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, collate_fn=already_batched, num_workers=workers)
        seen = 0
        t1 = time.perf_counter()
        for x, _ in loader:
            seen += len(x)
        t2 = time.perf_counter()
    assert isinstance(x, torch.Tensor)
    print(
        json.dumps(
            {
                "load_s": t1 - t0,
                "samples_per_s": seen / (t2 - t1),
                "peak_anon_mb": (peak.peak - base) / 1024,
                "samples": seen,
            }
        )
    )


def consumption(samples: int = 20 * BATCH * 20) -> float:
    """samples/s of the digits model's training steps on batches already in memory."""
    import torch
    import torch.nn.functional as F

    from trainyard.training.model import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN(10, 28, 28)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.rand(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    for _ in range(10):  # warm-up
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    t0 = time.perf_counter()
    for _ in range(samples // BATCH):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return samples / (time.perf_counter() - t0)


def evict(path: Path) -> None:
    """Drop a file's pages from the page cache, so a reader in a memory cgroup reads (and is charged for)
    them itself instead of finding them cached on the writer's account."""
    files = list(path.iterdir()) if path.is_dir() else [path]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def train_under_limit(
    data: PreparedData, out: Path, limit_mb: int, cache_mb: int
) -> tuple[int, float, float | None, str]:
    """One epoch of the digits recipe through the real worker (torchrun, 1 process) in a memory cgroup of
    ``limit_mb``; (exit code, the cgroup's peak MB, samples/s or None when it did not finish, its log)."""
    import memory_cgroup

    from trainyard.spec import parse_spec
    from trainyard.training.launchers.local import worker_env
    from trainyard.training.run_config import RunConfig

    out.mkdir(parents=True)
    spec = parse_spec(
        {"hyperparameters": {"epochs": 1}, "resources": {"gpus_per_node": 1}, "dataset": {"memory_cache_mb": cache_mb}}
    )
    config = RunConfig(spec=spec, data=data, out_dir=str(out)).dump(out / "run.json")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1"]
    argv += ["-m", "trainyard.training.entry", "--config", str(config)]
    for f in (data.train, data.val):
        evict(Path(f))
    proc, peak = memory_cgroup.run(argv, limit_mb, env=worker_env(1, dict(os.environ)), capture_output=True, text=True)
    result = out / "train_result.json"
    speed = json.loads(result.read_text())["samples_per_second"] if proc.returncode == 0 else None
    return proc.returncode, peak / (1 << 20), speed, proc.stdout + proc.stderr


def run_child(data: PreparedData, cache_mb: int, workers: int) -> dict:
    return child_result([__file__, "--child", data.model_dump_json(), str(cache_mb), str(workers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=15000, help="records at 1x")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--formats", nargs="+", default=["lmdb", "tfrecord"])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1], help="DataLoader workers (streamed)")
    parser.add_argument(
        "--limit-mb",
        type=int,
        default=640,
        help="memory cgroup of the training run, whose split is 1.25x this (0: no training run)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    from trainyard.data import formats

    eats = consumption()
    print(f"trainer consumption (digits model, batch {BATCH}, {os.environ.get('OMP_NUM_THREADS', 'default')} threads):")
    print(f"  {eats:.0f} samples/s per worker")
    print("fmt       scale  file MB | streamed: peak MB  samples/s (x consumption) | in memory: peak MB  samples/s")
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-data-") as tmp:
        for fmt in args.formats:
            val = Path(tmp) / formats.filename("val", fmt)  # small and the same for every scale
            write_split(val, fmt, 500)
            for scale in args.scales:
                path = Path(tmp) / formats.filename(f"train-{scale}", fmt)
                write_split(path, fmt, args.samples * scale)
                data = split_files(fmt, path, val, {"train": args.samples * scale, "val": 500})
                size_mb = formats.size_bytes(path) / (1 << 20)
                streamed = {w: run_child(data, 0, w) for w in args.workers}
                held = run_child(data, int(size_mb) + 1, 0)
                shown = "  ".join(
                    f"w{w}: {r['peak_anon_mb']:6.1f}  {r['samples_per_s']:8.0f} ({r['samples_per_s'] / eats:4.1f}x)"
                    for w, r in streamed.items()
                )
                print(
                    f"{fmt:9} {scale:4}x  {size_mb:7.1f} | {shown} | "
                    f"{held['peak_anon_mb']:6.1f}  {held['samples_per_s']:8.0f}",
                    flush=True,
                )
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        if args.limit_mb:
            train_limited(args.limit_mb, Path(tmp))


def train_limited(limit_mb: int, tmp: Path) -> None:
    """One epoch of a split a quarter bigger than ``limit_mb``, streamed and held, in a cgroup of that size."""
    import memory_cgroup

    from trainyard.data import formats

    why_not = memory_cgroup.available()
    if why_not:
        print(f"training under a memory limit: skipped ({why_not})")
        return
    probe = tmp / "probe.lmdb"
    write_split(probe, "lmdb", 4096)
    per_sample = formats.size_bytes(probe) / 4096
    limited = int(limit_mb * 1.25 * (1 << 20) / per_sample)
    data = split_files("lmdb", tmp / "limited.lmdb", tmp / "limited-val.lmdb", {"train": limited, "val": 500})
    write_split(Path(data.train), "lmdb", limited)
    write_split(Path(data.val), "lmdb", 500)
    size_mb = formats.size_bytes(tmp / "limited.lmdb") / (1 << 20)
    print(f"training one epoch of a {size_mb:.0f} MB split in a {limit_mb} MB memory cgroup (torchrun + 1 worker):")
    for cache_mb in (0, int(size_mb) + 1):
        how = "streamed" if cache_mb == 0 else "held in memory"
        code, _, speed, log = train_under_limit(data, tmp / f"limited-{cache_mb}", limit_mb, cache_mb)
        if code == 0:
            verdict = f"trained, {speed:.0f} samples/s"
        elif "Signal 9" in log or "exitcode  : -9" in log or code == -9:
            verdict = "killed by the kernel's OOM killer"
        else:
            verdict = f"failed with exit {code}:\n{log[-2000:]}"
        print(f"  {how:15} {verdict}", flush=True)


if __name__ == "__main__":
    main()
