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

    .venv/bin/python bench/data.py [--samples 15000] [--scales 1 4 16] [--formats lmdb tfrecord] [--workers 0 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def child(data_json: str, cache_mb: int, workers: int) -> None:
    """One epoch of rank 0 of 2 through the trainer's data path; prints JSON."""
    import torch
    from torch.utils.data import DataLoader

    from trainyard import recipes
    from trainyard.spec import parse_spec
    from trainyard.training.data import ShardSampler, already_batched
    from trainyard.training.run_config import RunConfig

    data = json.loads(data_json)
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


def run_child(data: dict, cache_mb: int, workers: int) -> dict:
    argv = [sys.executable, __file__, "--child", json.dumps(data), str(cache_mb), str(workers)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=15000, help="records at 1x")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--formats", nargs="+", default=["lmdb", "tfrecord"])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1], help="DataLoader workers (streamed)")
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
                data = {"format": fmt, "train": str(path), "val": str(val)}
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


if __name__ == "__main__":
    main()
