"""A split bigger than the memory a process is allowed: streamed, the worker's data path reads its epoch
under a limit the kernel enforces (a memory cgroup); held in memory, the kernel kills the same process,
which shows the limit is real. ``bench/data.py`` trains one epoch through torchrun the same way."""

import json
import sys
from pathlib import Path

import pytest

import checkout

REPO = Path(__file__).resolve().parents[2]
LIMIT_MB = 256  # the data path's process (Python, torch, the recipe) needs about 155 MB of it

pytestmark = pytest.mark.integration


def _bench(name: str):
    return checkout.load(f"bench/{name}.py", f"bench_{name}")


def test_a_split_bigger_than_the_limit_streams_and_the_held_one_is_killed(tmp_path):
    cgroup = _bench("memory_cgroup")
    why_not = cgroup.available()
    if why_not:
        pytest.skip(f"no memory cgroup can be made here: {why_not}")
    bench = _bench("data")
    from trainyard.data import formats

    train, val = tmp_path / "train.lmdb", tmp_path / "val.lmdb"
    bench.write_split(train, "lmdb", 240_000)
    bench.write_split(val, "lmdb", 200)
    size_mb = formats.size_bytes(train) / (1 << 20)
    assert size_mb > 1.15 * LIMIT_MB
    data = bench.split_files("lmdb", train, val, {"train": 240_000, "val": 200}).model_dump_json()

    def epoch(cache_mb: int):
        for path in (train, val):
            bench.evict(path)  # read, and charged, inside the cgroup
        argv = [sys.executable, str(REPO / "bench" / "data.py"), "--child", data, str(cache_mb), "0"]
        return cgroup.run(argv, LIMIT_MB, capture_output=True, text=True)

    streamed, _ = epoch(cache_mb=0)
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    result = json.loads(streamed.stdout.strip().splitlines()[-1])
    assert result["samples"] == 120_000  # rank 0 of 2: its half of the epoch
    assert result["peak_anon_mb"] < 16  # the shard order and a batch, not the split

    held, _ = epoch(cache_mb=int(size_mb) + 1)
    assert held.returncode == -9, f"held in memory, {size_mb:.0f} MB should not fit in {LIMIT_MB} MB"
