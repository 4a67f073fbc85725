"""Record formats for prepared training data, chosen by the JobSpec's ``dataset.format``.

Each format module offers ``write(path, records, meta) -> count`` and
``read(path) -> (keys, labels, images, meta)``; a record may be (key, label, image, target) with a JSON-able
target, which ``read_records(path, with_targets=True)`` returns, in key order, after the other four.
"""

from __future__ import annotations

import importlib

FORMATS = {"lmdb": ("trainyard.data.lmdb_format", "lmdb"), "tfrecord": ("trainyard.data.tfrecord_format", "tfrecord")}


def module(fmt: str):
    if fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r}; allowed: {sorted(FORMATS)}")
    return importlib.import_module(FORMATS[fmt][0])


def filename(split: str, fmt: str) -> str:
    module(fmt)
    return f"{split}.{FORMATS[fmt][1]}"


def read(fmt: str, path):
    return module(fmt).read(path)


def write(fmt: str, path, records, meta: dict) -> int:
    return module(fmt).write(path, records, meta)


def read_with_targets(fmt: str, path):
    return module(fmt).read_records(path, with_targets=True)
