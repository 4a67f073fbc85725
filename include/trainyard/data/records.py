"""Prepared records as the training side reads them: a batch of samples by index, from the file or from
memory, in one shape for every record format.

A reader (``lmdb_format.Reader``, ``tfrecord_format.Reader``, or :class:`InMemory`) has ``meta``, a length
and ``batch(indices) -> RecordBatch``. Training reads a split batch by batch, so a rank touches only the
samples its sampler gives it and its memory does not grow with the dataset; a split small enough is read
once into memory (:func:`trainyard.training.data.load_split` decides), where a batch is a slice.
"""

from __future__ import annotations

from collections.abc import Sequence
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


class Reader(Protocol):
    meta: dict

    def __len__(self) -> int: ...

    def batch(self, indices: Sequence[int]) -> RecordBatch: ...


class InMemory:
    """A whole split read once (a reader's every record); a batch is fancy indexing, no decoding."""

    def __init__(self, reader: Reader) -> None:
        self.meta = reader.meta
        self.all = reader.batch(range(len(reader)))

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
