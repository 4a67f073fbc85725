"""LMDB record files for training: one record per sample, read by index.

Record ``i`` (the i-th sample in key order) is stored under ``i`` as an 8-byte big-endian integer, so the
file's own order is the sample order and a reader fetches any sample, or a batch of them in one read
transaction, without holding a list of keys. The value carries everything of the sample: its key, label,
JSON target (detection boxes, a sentence pair; may be absent) and array (shape and dtype, then the raw
bytes, which ``np.frombuffer`` reads without parsing). ``__trainyard_meta__`` holds the dataset metadata
and the record count, so a reader needs nothing but the file; named keys are longer than 8 bytes and so
never meet a record's.

Writing streams: records are committed in transactions of at most ``COMMIT_BYTES`` (an LMDB write
transaction holds its dirty pages in memory), and the map grows as the file does.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainyard.data.records import RecordBatch

META_KEY = b"__trainyard_meta__"
COMMIT_BYTES = 64 << 20
INITIAL_MAP_BYTES = 64 << 20  # doubled whenever a commit does not fit
_INDEX = struct.Struct(">Q")
_HEAD = struct.Struct("<qIIB")  # label, key bytes, target bytes, array dims
_DIM = struct.Struct("<Q")


def index_key(i: int) -> bytes:
    return _INDEX.pack(i)


def encode(key: str, label: int, image: np.ndarray, target=None) -> bytes:
    image = np.ascontiguousarray(image)
    raw_key = key.encode()
    raw_target = json.dumps(target).encode() if target is not None else b""
    dtype = image.dtype.str.encode()  # e.g. b"|u1", b"<f4": byte order included
    return b"".join(
        (
            _HEAD.pack(int(label), len(raw_key), len(raw_target), image.ndim),
            b"".join(_DIM.pack(d) for d in image.shape),
            bytes((len(dtype),)),
            dtype,
            raw_key,
            raw_target,
            image.tobytes(),
        )
    )


def decode(value, where: str) -> tuple[str, int, np.ndarray, object]:
    """(key, label, array, target or None) of one stored value. The array is a view of ``value`` (in
    native byte order; a copy where the stored order differs): a caller that keeps it past the read
    transaction copies it (``Reader.batch`` does, once)."""
    try:
        label, n_key, n_target, ndim = _HEAD.unpack_from(value)
        pos = _HEAD.size
        shape = tuple(_DIM.unpack_from(value, pos + _DIM.size * d)[0] for d in range(ndim))
        pos += _DIM.size * ndim
        n_dtype = value[pos]
        dtype = np.dtype(bytes(value[pos + 1 : pos + 1 + n_dtype]).decode())
        pos += 1 + n_dtype
        key = bytes(value[pos : pos + n_key]).decode()
        pos += n_key
        target = json.loads(bytes(value[pos : pos + n_target])) if n_target else None
        pos += n_target
        count = int(np.prod(shape, dtype=np.int64))
        if len(value) - pos != count * dtype.itemsize:
            raise ValueError(f"array of {shape} {dtype} needs {count * dtype.itemsize} bytes, has {len(value) - pos}")
        array = np.frombuffer(value, dtype=dtype, count=count, offset=pos).reshape(shape)
    except (struct.error, IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: corrupt record: {err}") from None
    return key, int(label), array.astype(dtype.newbyteorder("="), copy=False), target


def write(path: str | Path, records: Iterable[tuple], meta: dict) -> int:
    """``records``: (key, label, image) or (key, label, image, target) with a JSON-able target, streamed
    (held one transaction at a time)."""
    import lmdb

    path = Path(path)
    map_size = INITIAL_MAP_BYTES
    env = lmdb.open(str(path), map_size=map_size, subdir=True, lock=False)

    def put(items: list[tuple[bytes, bytes]]) -> None:
        """One write transaction; an aborted one wrote nothing, so it grows the map and is redone."""
        nonlocal map_size
        while True:
            try:
                with env.begin(write=True) as txn:
                    for key, value in items:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                map_size *= 2
                env.set_mapsize(map_size)

    count = 0
    pending: list[tuple[bytes, bytes]] = []
    pending_bytes = 0
    try:
        for record in records:
            value = encode(*record)
            pending.append((index_key(count), value))
            pending_bytes += len(value)
            count += 1
            if pending_bytes >= COMMIT_BYTES:
                put(pending)
                pending, pending_bytes = [], 0
        put(pending)
        put([(META_KEY, json.dumps({"meta": meta, "count": count}).encode())])
        env.sync()
    finally:
        env.close()
    return count


# One read-only handle per file and process: LMDB refuses a second open of a file in one process, and a
# handle must not be used across fork (a forked DataLoader worker closes its copy and opens its own).
_HANDLES: dict[tuple[int, int], tuple[int, Any]] = {}


def _handle(path: Path, file_id: tuple[int, int]):
    import lmdb

    held = _HANDLES.get(file_id)
    if held is not None and held[0] == os.getpid():
        return held[1]
    if held is not None:  # the parent's, inherited through fork: closing this process's copy is safe
        with contextlib.suppress(lmdb.Error):
            held[1].close()
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=False)
    except lmdb.Error as err:
        raise ValueError(f"{path}: cannot open LMDB file: {err}") from None
    _HANDLES[file_id] = (os.getpid(), env)
    return env


class Reader:
    """The records of one LMDB file by index, one read transaction per batch. Pickles as its path, so a
    DataLoader worker (spawned or forked) opens its own handle."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            st = (self.path / "data.mdb").stat()
        except FileNotFoundError:
            raise ValueError(f"{self.path}: not an LMDB dataset (no data.mdb)") from None
        self._file = (st.st_dev, st.st_ino)
        with self._txn() as txn:
            raw = txn.get(META_KEY)
            head = json.loads(bytes(raw)) if raw is not None else None
        if head is None:
            raise ValueError(f"{self.path}: no {META_KEY.decode()} record (not written by trainyard, or cut short)")
        self.meta: dict = head["meta"]
        self.count: int = head["count"]

    def _txn(self):
        return _handle(self.path, self._file).begin(buffers=True)

    def __len__(self) -> int:
        return self.count

    def batch(self, indices: Sequence[int]) -> RecordBatch:
        rows = []
        with self._txn() as txn:
            for i in indices:
                if not 0 <= i < self.count:
                    raise IndexError(f"{self.path}: record {i} out of range (0..{self.count - 1})")
                value = txn.get(index_key(i))
                if value is None:
                    raise ValueError(f"{self.path}: record {i} of {self.count} is missing")
                rows.append(decode(value, f"{self.path} record {i}"))
            batch = RecordBatch.of(rows)  # stacking copies the arrays out of the transaction's buffers
            if isinstance(batch.arrays, list):  # not stacked (shapes differ): copy each
                batch.arrays = [a.copy() for a in batch.arrays]
        return batch
