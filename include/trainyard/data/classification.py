"""The image-classification dataset layout, and the built-in scikit-learn digits source.

Layout of a dataset commit::

    classes.json          {"classes": [...], "height": H, "width": W, "pixel_max": P}
    labels.csv            key,label          (one row per sample; label = index into classes)
    images/<key>.npy      uint8 array of shape (H, W)
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainyard.data.store import Commit, LocalStore, ingest_files
from trainyard.errors import DataFormatError


@dataclass
class ClassificationData:
    keys: list[str]
    labels: np.ndarray  # int64 (N,)
    images: list[np.ndarray]  # each (H, W); shapes are validated, not assumed
    meta: dict


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def digits_files() -> dict[str, bytes]:
    """scikit-learn's bundled handwritten digits (1797 8x8 images, values 0..16) in the dataset layout."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    files: dict[str, bytes] = {}
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    writer.writerow(["key", "label"])
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        key = f"digits-{i:05d}"
        files[f"images/{key}.npy"] = _npy_bytes(image.astype(np.uint8))
        writer.writerow([key, int(label)])
    files["labels.csv"] = rows.getvalue().encode()
    meta = {"classes": [str(c) for c in digits.target_names], "height": 8, "width": 8, "pixel_max": 16}
    files["classes.json"] = json.dumps(meta, indent=1).encode()
    return files


def ingest_digits(store: LocalStore, repo: str, branch: str = "main") -> Commit:
    """Ingest the digits into ``repo``/``branch``. Identical content commits nothing new, so the same
    bytes always pin the same commit id."""
    import sklearn

    return ingest_files(
        store,
        repo,
        branch,
        digits_files(),
        "ingest scikit-learn digits",
        {"source": "sklearn.datasets.load_digits", "sklearn_version": sklearn.__version__},
    )


META_SHAPE = '{"classes": ["name", ...], "height": H, "width": W, "pixel_max": P}'


def read_meta(meta_file: Path) -> dict:
    """classes.json, checked for the shape every reader of it (validation, training) indexes into, so a
    wrong file is one message naming it and the expected shape rather than a KeyError or TypeError."""
    try:
        meta = json.loads(meta_file.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{meta_file}: not valid JSON ({err}); expected an object {META_SHAPE}") from None
    if not isinstance(meta, dict):
        raise DataFormatError(f"{meta_file}: is a JSON {type(meta).__name__}; expected an object {META_SHAPE}")
    problems = [f"'{k}' is missing" for k in ("classes", "height", "width", "pixel_max") if k not in meta]
    classes = meta.get("classes")
    if "classes" in meta and not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        problems.append(f"'classes' must be a non-empty list of names, got {classes!r:.60}")
    for k in ("height", "width", "pixel_max"):
        v = meta.get(k)
        if k in meta and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (k != "pixel_max" and v != int(v))
        ):
            problems.append(f"'{k}' must be a positive {'number' if k == 'pixel_max' else 'integer'}, got {v!r}")
    if problems:
        raise DataFormatError(f"{meta_file}: {'; '.join(problems)}; expected {META_SHAPE}")
    return meta


def load_classification(root: str | Path) -> ClassificationData:
    """Read an exported dataset folder. Raises ValueError naming the file on malformed input."""
    root = Path(root)
    meta_file = root / "classes.json"
    labels_file = root / "labels.csv"
    for required in (meta_file, labels_file):
        if not required.exists():
            raise DataFormatError(f"dataset at {root} has no {required.name}")
    meta = read_meta(meta_file)
    keys: list[str] = []
    labels: list[int] = []
    images: list[np.ndarray] = []
    with labels_file.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != ["key", "label"]:
            raise DataFormatError(f"{labels_file}: header must be 'key,label', got {reader.fieldnames}")
        for lineno, row in enumerate(reader, start=2):
            key, label = row["key"], row["label"]
            try:
                labels.append(int(label))
            except (TypeError, ValueError):
                labels.append(-1)  # left for validation to report with the others
            keys.append(key)
            img_path = root / "images" / f"{key}.npy"
            if not img_path.exists():
                raise DataFormatError(f"{labels_file}:{lineno}: image {img_path.name} is missing")
            try:
                images.append(np.load(img_path, allow_pickle=False))
            except (ValueError, OSError, EOFError) as err:
                raise DataFormatError(f"{labels_file}:{lineno}: image {img_path.name} is unreadable: {err}") from None
    return ClassificationData(keys, np.asarray(labels, dtype=np.int64), images, meta)


def profile(data: ClassificationData):
    """One row per sample: what the validation suite checks."""
    import pandas as pd

    return pd.DataFrame(
        {
            "key": data.keys,
            "label": data.labels,
            "height": [img.shape[0] if img.ndim == 2 else -1 for img in data.images],
            "width": [img.shape[1] if img.ndim == 2 else -1 for img in data.images],
            "pixel_min": [float(img.min()) if img.size else None for img in data.images],
            "pixel_max": [float(img.max()) if img.size else None for img in data.images],
        }
    )


def validate_classification(root: str | Path, docs_dir: str | Path | None = None):
    """The ``image_classification`` suite over a dataset folder, bounds taken from its classes.json."""
    from trainyard.data.validation import load_suite_config, validate_dataframe

    data = load_classification(root)
    n = len(data.meta["classes"])
    values = {
        "max_label": n - 1,
        "all_labels": list(range(n)),
        "height": data.meta["height"],
        "width": data.meta["width"],
        "pixel_max": data.meta["pixel_max"],
    }
    return validate_dataframe(profile(data), load_suite_config("image_classification", values), docs_dir=docs_dir)
