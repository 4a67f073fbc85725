"""Split a dataset commit and write it in the chosen record format, cached by (commit, settings)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from trainyard.data import formats
from trainyard.data.classification import load_classification
from trainyard.data.split import split_keys


class LeakageError(ValueError):
    """A sample key landed in more than one split."""


def cache_key(commit: str, val_fraction: float, seed: int, fmt: str = "lmdb", test_fraction: float = 0.0) -> str:
    settings = {"val_fraction": val_fraction, "seed": seed, "format": fmt}
    if test_fraction:
        settings["test_fraction"] = test_fraction
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return f"{commit[:16]}-{digest}"


def check_leakage(splits: dict[str, list[str]]) -> None:
    """The split_leakage expectation suite over (key, split) rows; raises LeakageError listing the keys."""
    import pandas as pd

    from trainyard.data.validation import load_suite_config, validate_dataframe

    rows = [(k, name) for name, keys in splits.items() for k in keys]
    report = validate_dataframe(pd.DataFrame(rows, columns=["key", "split"]), load_suite_config("split_leakage", {}))
    if not report.success:
        raise LeakageError("split leakage:\n" + report.summary())


def prepare_classification(
    dataset_dir: str | Path,
    commit: str,
    cache_root: str | Path,
    val_fraction: float,
    seed: int,
    fmt: str = "lmdb",
    test_fraction: float = 0.0,
) -> dict:
    """Return the prepared dataset's manifest, building it only if the cache has none.

    The result is built in a temp dir and renamed into place, so a crash never leaves a half cache and
    two concurrent preparers agree (the loser discards its copy)."""
    cache_root = Path(cache_root)
    out = cache_root / cache_key(commit, val_fraction, seed, fmt, test_fraction)
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        return dict(json.loads(manifest_path.read_text()), cached=True)

    data = load_classification(dataset_dir)
    index = {k: i for i, k in enumerate(data.keys)}
    splits = split_keys(data.keys, val_fraction, seed, test_fraction)
    if not test_fraction:
        splits.pop("test")
    check_leakage(splits)
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".prep-"))
    try:
        counts, files = {}, {}
        for name, keys in splits.items():
            records = ((k, int(data.labels[index[k]]), data.images[index[k]]) for k in sorted(keys))
            files[name] = formats.filename(name, fmt)
            counts[name] = formats.write(fmt, tmp / files[name], records, data.meta)
        manifest = {
            "commit": commit,
            "format": fmt,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "seed": seed,
            "counts": counts,
            "num_classes": len(data.meta["classes"]),
            "classes": data.meta["classes"],
            "path": str(out),
            **{name: str(out / f) for name, f in files.items()},
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
