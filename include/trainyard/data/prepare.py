"""Split a dataset commit and write it in the chosen record format, cached by (commit, settings)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from trainyard.data import formats
from trainyard.data.split import split_keys
from trainyard.data.store import publish_dir


class PreparedData(BaseModel):
    """A dataset commit split and written as records (``prepare_data``'s result, :func:`prepare_records`):
    its ``manifest.json`` in the cache, what a recipe's training, evaluation and export read. JSON only in
    that file, at the XCom boundary and in a training's run config; a later task of the pipeline reads it
    again from the cache, never from the XCom (``dags/train_pipeline.py``)."""

    # a field it does not know is a newer platform's (a manifest or run config it wrote): read past it. Never
    # read from an XCom (the later tasks read it from the cache or the training's run config)
    model_config = ConfigDict(frozen=True, extra="ignore")

    commit: str
    format: str  # a trainyard.data.formats name: lmdb, tfrecord
    val_fraction: float
    test_fraction: float
    seed: int
    variant: str = ""  # what else shaped the records (a recipe and its input size)
    counts: dict[str, int]  # records per split
    path: str  # the folder of the split files
    train: str  # each split's file
    val: str
    test: str | None = None  # only with a test_fraction
    classes: list[str] | None = None  # a classification dataset's labels, in their index order
    num_classes: int | None = None
    cached: bool = False  # found in the cache (not built by this call)

    def split(self, name: str) -> str:
        """The file of the split ``name`` (train, val, test); ValueError naming the splits it has if absent."""
        found = {"train": self.train, "val": self.val, "test": self.test}.get(name)
        if found is None:
            have = ", ".join(k for k in ("train", "val", "test") if k in self.counts)
            raise ValueError(f"the prepared data of commit {self.commit[:12]} has no split {name!r} (it has {have})")
        return found


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
) -> PreparedData:
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
        return PreparedData.model_validate_json(manifest_path.read_text()).model_copy(update={"cached": True})

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
        classes = meta.get("classes")
        manifest = PreparedData.model_validate(
            {
                "commit": commit,
                "format": fmt,
                "val_fraction": val_fraction,
                "test_fraction": test_fraction,
                "seed": seed,
                "variant": variant,
                "counts": counts,
                "path": str(out),
                "classes": classes,
                "num_classes": None if classes is None else len(classes),
                **{name: str(out / f) for name, f in files.items()},  # train, val and test where there is one
            }
        )
        (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=1, exclude={"cached"}, exclude_none=True))
        publish_dir(tmp, out)  # a concurrent preparer that finished first is success: its copy is equal
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreparedData.model_validate_json(manifest_path.read_text())
