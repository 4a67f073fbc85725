"""Record formats for prepared training data, chosen by the JobSpec's ``dataset.format``.

Each format module offers ``write(path, records, meta) -> count`` (records streamed: (key, label, array)
or (key, label, array, target) with a JSON-able target) and ``Reader(path)``, the records by index
(:mod:`trainyard.data.records`). ``read`` and ``read_with_targets`` return a whole split at once, for the
task-side steps of small splits and for tests.
"""

from __future__ import annotations

import importlib

from trainyard.data.records import Reader

FORMATS = {"lmdb": ("trainyard.data.lmdb_format", "lmdb"), "tfrecord": ("trainyard.data.tfrecord_format", "tfrecord")}


def module(fmt: str):
    if fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r}; allowed: {sorted(FORMATS)}")
    return importlib.import_module(FORMATS[fmt][0])


def filename(split: str, fmt: str) -> str:
    module(fmt)
    return f"{split}.{FORMATS[fmt][1]}"


def open_records(fmt: str, path) -> Reader:
    return module(fmt).Reader(path)


def size_bytes(path) -> int:
    """The bytes a split's records take on disk (an LMDB directory's files, or the TFRecord file)."""
    from pathlib import Path

    path = Path(path)
    return sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size


def write(fmt: str, path, records, meta: dict) -> int:
    return module(fmt).write(path, records, meta)


def read_with_targets(fmt: str, path):
    """(keys, labels, arrays stacked, meta, targets) of a whole split."""
    from trainyard.data.records import InMemory

    split = InMemory(open_records(fmt, path))
    everything = split.all
    if isinstance(everything.arrays, list):
        raise ValueError(f"{path}: its arrays differ in shape; read it batch by batch (open_records)")
    return everything.keys, everything.labels, everything.arrays, split.meta, everything.targets


def read(fmt: str, path):
    """(keys, labels, arrays stacked, meta) of a whole split."""
    return read_with_targets(fmt, path)[:4]
