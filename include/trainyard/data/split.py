"""Deterministic train/val/test split by a hash of each sample's key.

A sample's split depends only on (seed, key), never on the other samples, so appending data never moves
an existing sample from one split to another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def bucket(key: str, seed: int) -> float:
    """A uniform number in [0, 1) from (seed, key)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign(key: str, val_fraction: float, seed: int, test_fraction: float = 0.0) -> str:
    b = bucket(key, seed)
    if b < val_fraction:
        return "val"
    if b < val_fraction + test_fraction:
        return "test"
    return "train"


def split_keys(keys: Iterable[str], val_fraction: float, seed: int, test_fraction: float = 0.0) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for key in keys:
        out[assign(key, val_fraction, seed, test_fraction)].append(key)
    return out
