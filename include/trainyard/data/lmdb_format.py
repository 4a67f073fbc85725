"""LMDB record files for training: one record per sample, keyed by the sample key.

Value = 8-byte little-endian label + the image as .npy bytes. ``__keys__`` holds the key order and
``__meta__`` the dataset metadata, so a reader needs nothing but the file. A record may carry a target
beyond its label (detection boxes, a sentence pair): JSON under ``__target__/<key>``.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_LABEL = struct.Struct("<q")


def encode(label: int, image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, image, allow_pickle=False)
    return _LABEL.pack(int(label)) + buf.getvalue()


def decode(value: bytes, where: str) -> tuple[int, np.ndarray]:
    if len(value) < _LABEL.size:
        raise ValueError(f"{where}: record truncated ({len(value)} bytes)")
    (label,) = _LABEL.unpack_from(value)
    try:
        image = np.load(io.BytesIO(value[_LABEL.size :]), allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise ValueError(f"{where}: corrupt image record: {err}") from None
    return label, image


TARGET_PREFIX = "__target__/"


def write(path: str | Path, records: Iterable[tuple], meta: dict) -> int:
    """``records``: (key, label, image) or (key, label, image, target) with a JSON-able target."""
    import lmdb

    path = Path(path)
    records = [tuple(r) + (None,) * (4 - len(r)) for r in records]
    reserved = [r[0] for r in records if r[0].startswith("__")]
    if reserved:  # __keys__, __meta__ and __target__/<key> are this file's own records
        raise ValueError(f"{path}: sample keys may not start with '__' (reserved): {reserved[:5]}")
    targets = [json.dumps(r[3]).encode() if r[3] is not None else None for r in records]
    size = sum(r[2].nbytes + 256 for r in records) * 2 + sum(len(t or b"") * 2 for t in targets) + (1 << 20)
    env = lmdb.open(str(path), map_size=size, subdir=True, lock=False)
    keys = []
    with env.begin(write=True) as txn:
        for (key, label, image, _), target in zip(records, targets, strict=True):
            txn.put(key.encode(), encode(label, image))
            if target is not None:
                txn.put((TARGET_PREFIX + key).encode(), target)
            keys.append(key)
        txn.put(b"__keys__", json.dumps(keys).encode())
        txn.put(b"__meta__", json.dumps(meta).encode())
    env.sync()
    env.close()
    return len(keys)


def _open(path: Path):
    import lmdb

    if not (path / "data.mdb").exists():
        raise ValueError(f"{path}: not an LMDB dataset (no data.mdb)")
    try:
        return lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    except lmdb.Error as err:
        raise ValueError(f"{path}: cannot open LMDB file: {err}") from None


def read(path: str | Path) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """All records of a (small) LMDB file as (keys, labels, images stacked, meta)."""
    return read_records(path, with_targets=False)[:4]


def read_records(path: str | Path, with_targets: bool):
    """(keys, labels, images stacked, meta, targets): with ``with_targets`` each record's target (None
    where it has none), in key order, read in the same pass; else an empty list."""
    path = Path(path)
    env = _open(path)
    with env.begin() as txn:
        raw_keys = txn.get(b"__keys__")
        if raw_keys is None:
            raise ValueError(f"{path}: missing __keys__ record")
        keys = json.loads(raw_keys)
        meta = json.loads(txn.get(b"__meta__") or b"{}")
        labels, images, targets = [], [], []
        for key in keys:
            value = txn.get(key.encode())
            if value is None:
                raise ValueError(f"{path}: record {key!r} listed in __keys__ is missing")
            label, image = decode(value, f"{path} record {key!r}")
            labels.append(label)
            images.append(image)
            if with_targets:
                raw = txn.get((TARGET_PREFIX + key).encode())
                targets.append(json.loads(raw) if raw is not None else None)
    env.close()
    stacked = np.stack(images) if images else np.zeros((0,), dtype=np.uint8)
    return keys, np.asarray(labels, dtype=np.int64), stacked, meta, targets
