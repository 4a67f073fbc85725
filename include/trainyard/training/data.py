"""A prepared split as the worker loop reads it: batches fetched by index, turned into tensors by the
recipe's collate function.

``load_split`` holds a split in memory when its records file is at most ``dataset.memory_cache_mb``
(a batch is then a slice, as fast as tensors in memory), and otherwise reads each batch from the file in
one go (one LMDB read transaction, or one ``pread`` per TFRecord record): a rank reads only the samples its
sampler hands it, and its memory does not grow with the dataset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset, Sampler

from trainyard.data import formats
from trainyard.data.records import InMemory, Reader, RecordBatch, batches

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

Collate = Callable[[RecordBatch], list[torch.Tensor]]


def load_split(data: PreparedData | None, split: str, memory_cache_mb: int) -> Reader:
    """The split's records, in memory when its file is at most ``memory_cache_mb`` MB, else from the file;
    ValueError where the run config names no prepared data (``data``: its ``data``)."""
    if data is None:
        raise ValueError("the run config names no prepared data: a built-in recipe trains on a prepare_data result")
    path = data.split(split)
    reader = formats.open_records(data.format, path)
    if formats.size_bytes(path) <= memory_cache_mb * (1 << 20):
        return InMemory(reader)
    return reader


class RecordDataset(Dataset):
    """Map-style dataset of a split whose items are whole batches: the DataLoader hands ``__getitems__``
    a batch's indices (its sampler's, so DistributedSampler shards it), and gets the collated tensors;
    ``already_batched`` is then the DataLoader's collate_fn. ``collate`` must pickle (a module-level
    function or a ``functools.partial`` of one) for DataLoader workers."""

    def __init__(self, records: Reader, collate: Collate) -> None:
        self.records, self.collate = records, collate

    def __len__(self) -> int:
        return len(self.records)

    def __getitems__(self, indices: Sequence[int]) -> list[torch.Tensor]:
        return self.collate(self.records.batch(indices))

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        """One sample as a batch of one (DataLoader uses ``__getitems__``)."""
        return self.__getitems__([index])

    def batches(self, size: int) -> Iterator[list[torch.Tensor]]:
        """The whole split in order, ``size`` samples at a time (validation, evaluation)."""
        for _, tensors in self.record_batches(size):
            yield tensors

    def record_batches(self, size: int) -> Iterator[tuple[RecordBatch, list[torch.Tensor]]]:
        """``batches`` with each batch's records (keys, targets) beside its tensors, read once."""
        for records in batches(self.records, size):
            yield records, self.collate(records)


def already_batched(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """The DataLoader's collate_fn for a :class:`RecordDataset`: its items are batches already."""
    return batch


class ShardSampler(Sampler[int]):
    """This rank's shard of each epoch's shuffled order: the order of torch's DistributedSampler (same
    permutation, padding and striding, so a run's data order is the one it always had), held as an int64
    tensor (8 bytes a sample, not a list of Python ints at 36), less the samples of the batches a resumed
    run already did: those are skipped as indices, never read."""

    def __init__(self, dataset: Sized, world: int, rank: int, seed: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1}")
        self.size, self.world, self.rank, self.seed = len(dataset), world, rank, seed
        self.per_rank = math.ceil(self.size / world)
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip_samples: int = 0) -> None:
        """The same permutation for an epoch after a restart, so skipping resumes the data position."""
        self.epoch, self.skip = epoch, skip_samples

    def shard(self) -> torch.Tensor:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        total = self.per_rank * self.world
        if total > self.size:  # padded with the order's first samples, so every rank gets as many
            order = torch.cat([order, order.repeat(math.ceil((total - self.size) / self.size))[: total - self.size]])
        return order[self.rank : total : self.world][self.skip :]

    def __iter__(self) -> Iterator[int]:
        shard = self.shard().numpy()
        for start in range(0, len(shard), 4096):
            yield from shard[start : start + 4096].tolist()

    def __len__(self) -> int:
        return max(self.per_rank - self.skip, 0)
