"""Split a dataset commit and write it as LMDB, cached by (commit, split settings)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from trainyard.data import lmdb_format
from trainyard.data.classification import load_classification
from trainyard.data.split import split_keys


def cache_key(commit: str, val_fraction: float, seed: int, fmt: str = "lmdb") -> str:
    settings = json.dumps({"val_fraction": val_fraction, "seed": seed, "format": fmt}, sort_keys=True)
    return f"{commit[:16]}-{hashlib.sha256(settings.encode()).hexdigest()[:12]}"


def prepare_classification(
    dataset_dir: str | Path, commit: str, cache_root: str | Path, val_fraction: float, seed: int
) -> dict:
    """Return the prepared dataset's manifest, building it only if the cache has none.

    The result is built in a temp dir and renamed into place, so a crash never leaves a half cache and
    two concurrent preparers agree (the loser discards its copy)."""
    cache_root = Path(cache_root)
    out = cache_root / cache_key(commit, val_fraction, seed)
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        return dict(json.loads(manifest_path.read_text()), cached=True)

    data = load_classification(dataset_dir)
    index = {k: i for i, k in enumerate(data.keys)}
    splits = split_keys(data.keys, val_fraction, seed)
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".prep-"))
    try:
        counts = {}
        for name, keys in splits.items():
            records = ((k, int(data.labels[index[k]]), data.images[index[k]]) for k in sorted(keys))
            counts[name] = lmdb_format.write(tmp / f"{name}.lmdb", records, data.meta)
        manifest = {
            "commit": commit,
            "format": "lmdb",
            "val_fraction": val_fraction,
            "seed": seed,
            "counts": counts,
            "num_classes": len(data.meta["classes"]),
            "classes": data.meta["classes"],
            "path": str(out),
            "train": str(out / "train.lmdb"),
            "val": str(out / "val.lmdb"),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        try:
            os.replace(tmp, out)
        except OSError:
            if not manifest_path.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dict(json.loads(manifest_path.read_text()), cached=False)
