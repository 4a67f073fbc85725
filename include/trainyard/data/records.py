"""Prepared records as the training side reads them: a batch of samples by index, from the file or from
memory, in one shape for every record format.

A reader (``lmdb_format.Reader``, ``tfrecord_format.Reader``, or :class:`InMemory`) has ``meta``, a length
and ``batch(indices) -> RecordBatch``. Training reads a split batch by batch, so a rank touches only the
samples its sampler gives it and its memory does not grow with the dataset; a split small enough is read
once into memory (:func:`trainyard.training.data.load_split` decides), where a batch is a slice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass
class RecordBatch:
    """Samples side by side: ``arrays`` is one stacked array when every sample's array has the same shape
    and dtype (images of one size, the usual case), else a list of them (encoded images, any size)."""

    keys: list[str]
    labels: np.ndarray
    arrays: np.ndarray | list[np.ndarray]
    targets: list[Any]

    @classmethod
    def of(cls, rows: Sequence[tuple[str, int, np.ndarray, Any]]) -> RecordBatch:
        """From (key, label, array, target) rows."""
        arrays = [r[2] for r in rows]
        same = bool(arrays) and all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays)
        return cls(
            keys=[r[0] for r in rows],
            labels=np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
            arrays=np.stack(arrays) if same else arrays,
            targets=[r[3] for r in rows],
        )

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def concat(cls, parts: Sequence[RecordBatch]) -> RecordBatch:
        """Batches one after the other (a split read in chunks, so it is never held twice as rows)."""
        stacked = [p.arrays for p in parts if isinstance(p.arrays, np.ndarray)]
        same = len(stacked) == len(parts) and len({(a.shape[1:], a.dtype) for a in stacked}) <= 1
        arrays: np.ndarray | list[np.ndarray]
        if not parts:
            arrays = np.zeros((0,), dtype=np.uint8)
        elif same:
            arrays = np.concatenate(stacked)
        else:
            arrays = [a for p in parts for a in p.arrays]
        return cls(
            keys=[k for p in parts for k in p.keys],
            labels=np.concatenate([p.labels for p in parts]) if parts else np.zeros((0,), np.int64),
            arrays=arrays,
            targets=[t for p in parts for t in p.targets],
        )


class Reader(Protocol):
    meta: dict

    def __len__(self) -> int: ...

    def batch(self, indices: Sequence[int]) -> RecordBatch: ...


def batches(reader: Reader, size: int) -> Iterator[RecordBatch]:
    """Every record of ``reader`` in order, ``size`` at a time."""
    for start in range(0, len(reader), size):
        yield reader.batch(range(start, min(start + size, len(reader))))


class InMemory:
    """A whole split read once (a reader's every record); a batch is fancy indexing, no decoding."""

    def __init__(self, reader: Reader, chunk: int = 4096) -> None:
        self.meta = reader.meta
        self.all = RecordBatch.concat(list(batches(reader, chunk)))

    def __len__(self) -> int:
        return len(self.all)

    def batch(self, indices: Sequence[int]) -> RecordBatch:
        idx = np.asarray(indices, dtype=np.int64)
        arrays = self.all.arrays
        return RecordBatch(
            keys=[self.all.keys[i] for i in idx],
            labels=self.all.labels[idx],
            arrays=arrays[idx] if isinstance(arrays, np.ndarray) else [arrays[i] for i in idx],
            targets=[self.all.targets[i] for i in idx],
        )
