"""Split a dataset commit and write it in the chosen record format, cached by (commit, settings)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from trainyard.data import formats
from trainyard.data.split import split_keys
from trainyard.data.store import publish_dir


class LeakageError(ValueError):
    """A sample key landed in more than one split."""


# The records' layout inside their format: part of the cache key, so a layout change never reads an old file.
# 2: LMDB records keyed by index, each value self-describing (lmdb_format)
RECORD_LAYOUT = 2


def cache_key(commit: str, val_fraction: float, seed: int, fmt: str = "lmdb", test_fraction: float = 0.0) -> str:
    settings = {"val_fraction": val_fraction, "seed": seed, "format": fmt, "layout": RECORD_LAYOUT}
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


def prepare_records(
    samples: Callable[[], tuple[list[str], Callable[[str], tuple], dict]],
    commit: str,
    cache_root: str | Path,
    val_fraction: float,
    seed: int,
    fmt: str = "lmdb",
    test_fraction: float = 0.0,
    variant: str = "",
) -> dict:
    """Split the dataset's keys by hash and write each split's ``record(key)`` tuples in ``fmt``; return the
    prepared dataset's manifest, building it only if the cache has none. ``samples()`` gives (keys, record,
    meta) and is only called on a cache miss (reading a dataset is the slow part). ``variant`` names
    whatever else shapes the records (a recipe and its input size), so differently prepared copies of one
    commit never collide.

    The result is built in a temp dir and renamed into place, so a crash never leaves a half cache and
    two concurrent preparers both succeed (the later one discards its copy)."""
    cache_root = Path(cache_root)
    key = cache_key(commit, val_fraction, seed, fmt, test_fraction)
    if variant:
        key += "-" + hashlib.sha256(variant.encode()).hexdigest()[:8]
    out = cache_root / key
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        return dict(json.loads(manifest_path.read_text()), cached=True)

    keys, record, meta = samples()
    splits = split_keys(keys, val_fraction, seed, test_fraction)
    if not test_fraction:
        splits.pop("test")
    check_leakage(splits)
    empty = [name for name, ks in splits.items() if not ks]
    if empty:
        raise ValueError(
            f"split {empty} would be empty ({len(keys)} samples, val_fraction={val_fraction}, "
            f"test_fraction={test_fraction}): add data or change the fractions"
        )
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".prep-"))
    try:
        counts, files = {}, {}
        for name, ks in splits.items():
            files[name] = formats.filename(name, fmt)
            counts[name] = formats.write(fmt, tmp / files[name], (record(k) for k in sorted(ks)), meta)
        manifest = {
            "commit": commit,
            "format": fmt,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "seed": seed,
            "variant": variant,
            "counts": counts,
            "path": str(out),
            **{k: meta[k] for k in ("classes",) if k in meta},
            **({"num_classes": len(meta["classes"])} if "classes" in meta else {}),
            **{name: str(out / f) for name, f in files.items()},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        publish_dir(tmp, out)  # a concurrent preparer that finished first is success: its copy is equal
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dict(json.loads(manifest_path.read_text()), cached=False)
