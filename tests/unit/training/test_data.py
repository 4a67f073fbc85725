"""The worker's data path: splits streamed or held by size, batches by index, resumed epochs skipping
without reading."""

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from datafiles import prepared_in
from trainyard.data import formats
from trainyard.data.records import InMemory
from trainyard.training.data import RecordDataset, ShardSampler, already_batched, load_split


def _split(tmp_path, fmt, n=50):
    path = tmp_path / formats.filename("train", fmt)
    records = [(f"k{i:03d}", i, np.full((2, 3), i, np.uint8), {"i": i}) for i in range(n)]
    formats.write(fmt, path, records, {"kind": "test"})
    return prepared_in(tmp_path, {"train": n, "val": 0}, fmt)


def _collate(batch):
    return [torch.from_numpy(batch.arrays), torch.from_numpy(batch.labels)]


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_split_is_held_or_streamed_by_its_size(tmp_path, fmt):
    data = _split(tmp_path, fmt)
    assert isinstance(load_split(data, "train", memory_cache_mb=1), InMemory)  # a few KB
    streamed = load_split(data, "train", memory_cache_mb=0)
    assert not isinstance(streamed, InMemory) and streamed.meta == {"kind": "test"}
    for records in (streamed, load_split(data, "train", 1)):
        batch = records.batch([7, 3, 49])
        assert batch.keys == ["k007", "k003", "k049"] and batch.labels.tolist() == [7, 3, 49]
        assert batch.arrays.shape == (3, 2, 3) and batch.arrays[0, 0, 0] == 7
        assert batch.targets == [{"i": 7}, {"i": 3}, {"i": 49}]


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_loader_batches_equal_across_storage_and_workers(tmp_path, fmt):
    """The same epoch from memory, from the file, and from the file through a worker process."""
    data = _split(tmp_path, fmt)
    epochs = []
    for cache_mb, workers in ((1, 0), (0, 0), (0, 1)):
        dataset = RecordDataset(load_split(data, "train", cache_mb), _collate)
        sampler = ShardSampler(dataset, world=2, rank=1, seed=3)
        sampler.set_epoch(2)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=already_batched, num_workers=workers)
        epochs.append([y.tolist() for _, y in loader])
    assert epochs[0] == epochs[1] == epochs[2]
    assert sum(len(b) for b in epochs[0]) == 25  # rank 1's half


def test_resumed_epoch_skips_indices_without_reading_them(tmp_path):
    data = _split(tmp_path, "lmdb")
    read = []

    class Counting(RecordDataset):
        def __getitems__(self, indices):
            read.extend(indices)
            return super().__getitems__(indices)

    dataset = Counting(load_split(data, "train", 0), _collate)
    sampler = ShardSampler(dataset, world=1, rank=0, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=already_batched)
    sampler.set_epoch(4)
    full = [y.tolist() for _, y in loader]
    read.clear()
    sampler.set_epoch(4, skip_samples=3 * 8)  # three batches done before the restart
    resumed = [y.tolist() for _, y in loader]
    assert resumed == full[3:] and len(read) == 50 - 24


def test_batches_cover_the_split_in_order(tmp_path):
    dataset = RecordDataset(load_split(_split(tmp_path, "tfrecord"), "train", 0), _collate)
    got = [y.tolist() for _, y in dataset.batches(16)]
    assert [len(b) for b in got] == [16, 16, 16, 2] and sum(got, []) == list(range(50))


@pytest.mark.parametrize(("size", "world"), [(50, 1), (50, 2), (7, 3), (2, 5), (1000, 4)])
def test_shard_order_is_distributed_samplers(size, world):
    """A run's data order is what torch's DistributedSampler gives (resumes and old runs line up)."""
    from torch.utils.data.distributed import DistributedSampler

    data = range(size)
    for rank in range(world):
        ours = ShardSampler(data, world, rank, seed=11)
        theirs = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=11)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize(("size", "then", "now", "batch", "done"), [(1437, 2, 1, 32, 7), (1437, 1, 2, 32, 7),
                         (1000, 4, 3, 16, 5), (1437, 2, 1, 32, 22), (100, 3, 2, 8, 0)])  # fmt: skip
def test_a_position_carried_to_another_world_skips_nothing_and_redoes_less_than_a_batch_a_worker(
    size, then, now, batch, done
):
    """An elastic training resumed on ``now`` workers from a checkpoint that ``then`` wrote after ``done``
    batches a worker: together the new shards hold every sample the old ones had not reached, and fewer
    than ``now x batch`` samples twice."""
    from trainyard.training.common import resume_point

    data = range(size)
    old = [ShardSampler(data, then, r, seed=5) for r in range(then)]
    seen = {int(i) for s in old for i in s.shard()[: done * batch]}
    per_epoch = math.ceil(math.ceil(size / now) / batch)
    epoch, skip, step = resume_point(
        {"epoch": 2, "batches_done": done, "step": 99, "world": then}, per_epoch, "ck", print,
        world=now, batch_size=batch, size=size,
    )  # fmt: skip
    assert (epoch, step) == (2, 99)
    new = [ShardSampler(data, now, r, seed=5) for r in range(now)]
    for s in new:
        s.set_epoch(2 - 2, skip_samples=skip * batch)  # the same epoch's permutation (seed + epoch)
    left = [int(i) for s in new for i in s.shard()]
    assert set(range(size)) - seen <= set(left)  # nothing skipped
    assert len(seen & set(left)) < now * batch  # little redone


def test_a_position_of_a_finished_epoch_carried_to_another_world_goes_on_with_the_next():
    from trainyard.training.common import resume_point

    position = {"epoch": 0, "batches_done": 23, "step": 23, "world": 2}  # 1437 / 2 = 719 a worker: 23 batches
    assert resume_point(position, 45, "ck", print, world=1, batch_size=32, size=1437) == (1, 0, 23)
