"""The COCO object-detection dataset layout, its profiles, and its validation.

Layout of a dataset commit::

    annotations.json      COCO JSON:
                            images       [{id, file_name, width, height}, ...]
                            annotations  [{id, image_id, category_id, bbox: [x, y, w, h], area, iscrowd}, ...]
                            categories   [{id, name}, ...]
    images/<file_name>    PNG (or anything Pillow reads) or .npy of shape (H, W[, C])

Boxes are in pixels, (x, y) the top-left corner, as in COCO. ``load_coco`` only checks structure (keys
and types) so that a malformed file fails loudly; everything about the *values* (boxes inside images,
known ids, files present) is left to the great-expectations suites so that every breach is reported
together: ``coco_detection`` (one row per box) and ``coco_detection_images`` (one row per image).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from trainyard.data.validation import ValidationReport, load_suite_config, merge_reports, validate_dataframe
from trainyard.errors import DataFormatError

_REQUIRED = {
    "images": ("id", "file_name", "width", "height"),
    # area and iscrowd are written by our importers but many exporters omit them; they are not needed to
    # validate or train, so they are not required here.
    "annotations": ("id", "image_id", "category_id", "bbox"),
    "categories": ("id", "name"),
}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_file_name(file_name, where: str) -> None:
    """A COCO file_name must stay inside images/: relative, no '..', no drive (checked both ways, since
    exports are written on Windows too)."""
    if not isinstance(file_name, str) or not file_name.strip():
        raise DataFormatError(f"{where}: file_name must be a non-empty string, got {file_name!r}")
    for pure in (PurePosixPath(file_name), PureWindowsPath(file_name)):
        if pure.is_absolute() or pure.drive or pure.root:
            raise DataFormatError(f"{where}: file_name {file_name!r} is an absolute path")
        if ".." in pure.parts:
            raise DataFormatError(f"{where}: file_name {file_name!r} escapes the images folder ('..')")


def check_coco(coco, source: str) -> dict:
    """Structural checks of a parsed COCO dict; ``source`` names the file in error messages."""
    if not isinstance(coco, dict):
        raise DataFormatError(f"{source}: top level must be a JSON object, got {type(coco).__name__}")
    for section, keys in _REQUIRED.items():
        entries = coco.get(section)
        if not isinstance(entries, list):
            raise DataFormatError(f"{source}: '{section}' must be a list")
        for i, entry in enumerate(entries):
            where = f"{source}: {section}[{i}]"
            if not isinstance(entry, dict):
                raise DataFormatError(f"{where} is not an object")
            where += f" (id={entry.get('id')!r})"
            missing = [k for k in keys if k not in entry]
            if missing:
                raise DataFormatError(f"{where} lacks {missing}")
            # ids must be ints: JSON ids like "3" would silently never match an image_id of 3
            for k in ("id", "image_id", "category_id"):
                if k in keys and (not isinstance(entry[k], int) or isinstance(entry[k], bool)):
                    raise DataFormatError(f"{where}: {k} must be an integer, got {entry[k]!r}")
            if section == "images":
                check_file_name(entry["file_name"], where)
                if not (_is_number(entry["width"]) and _is_number(entry["height"])):
                    raise DataFormatError(f"{where}: width and height must be numbers")
            if section == "annotations":
                bbox = entry["bbox"]
                if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
                    raise DataFormatError(f"{where}: bbox must be [x, y, w, h] numbers, got {bbox!r}")
    # duplicate category ids make the id -> name mapping ambiguous for every consumer
    cat_ids = [c["id"] for c in coco["categories"]]
    dupes = sorted({c for c in cat_ids if cat_ids.count(c) > 1})
    if dupes:
        raise DataFormatError(f"{source}: categories repeat ids {dupes}")
    return coco


def load_coco(root: str | Path) -> dict:
    """Read ``root/annotations.json``. Raises ValueError naming the file and the offending entry."""
    path = Path(root) / "annotations.json"
    if not path.exists():
        raise DataFormatError(f"dataset at {root} has no annotations.json")
    try:
        coco = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid UTF-8 JSON: {exc}") from None
    return check_coco(coco, str(path))


def profile_boxes(coco: dict):
    """One row per annotation: what the ``coco_detection`` suite checks."""
    import pandas as pd

    sizes = {img["id"]: (img["width"], img["height"]) for img in coco["images"]}
    categories = {c["id"] for c in coco["categories"]}
    anns = coco["annotations"]
    x, y, w, h = (np.array([a["bbox"][i] for a in anns], dtype=float) for i in range(4))
    # unknown image -> NaN size; the bounds checks skip those rows (image_known already reports them)
    width = np.array([sizes.get(a["image_id"], (np.nan, np.nan))[0] for a in anns], dtype=float)
    height = np.array([sizes.get(a["image_id"], (np.nan, np.nan))[1] for a in anns], dtype=float)
    return pd.DataFrame(
        {
            "annotation_id": [a["id"] for a in anns],
            "image_id": [a["image_id"] for a in anns],
            "category_id": [a["category_id"] for a in anns],
            "x": x,
            "y": y,
            "w": w,
            "h": h,
            "image_width": width,
            "image_height": height,
            "image_known": np.array([a["image_id"] in sizes for a in anns], dtype=bool),
            "category_known": np.array([a["category_id"] in categories for a in anns], dtype=bool),
            # rounded so float noise from percent->pixel conversion can't flag a box ending on the edge
            "x_max": np.round(x + w, 6),
            "y_max": np.round(y + h, 6),
        }
    )


def _actual_size(path: Path) -> tuple[int, int] | None:
    """(width, height) read from the file itself, or None if it cannot be read."""
    try:
        if path.suffix == ".npy":
            shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
            return (shape[1], shape[0]) if len(shape) >= 2 else None
        from PIL import Image

        with Image.open(path) as img:  # reads the header only
            return img.size
    except Exception:
        return None


def profile_images(coco: dict, root: str | Path):
    """One row per image: what the ``coco_detection_images`` suite checks.

    ``size_matches`` compares the declared width/height with the file's real size (boxes are checked
    against the declared size, so a wrong one would hide out-of-image boxes). It is None when the file
    is missing, so that breach is only reported once, by ``file_exists``.
    """
    import pandas as pd

    images_dir = Path(root) / "images"
    exists, matches = [], []
    for img in coco["images"]:
        path = images_dir / img["file_name"]
        exists.append(path.is_file())
        matches.append((_actual_size(path) == (img["width"], img["height"])) if exists[-1] else None)
    return pd.DataFrame(
        {
            "image_id": [img["id"] for img in coco["images"]],
            "file_name": [img["file_name"] for img in coco["images"]],
            "file_exists": np.array(exists, dtype=bool),
            "width": [img["width"] for img in coco["images"]],
            "height": [img["height"] for img in coco["images"]],
            "size_matches": pd.Series(matches, dtype=object),
        }
    )


def validate_detection(
    root: str | Path, config_dir: Path | None = None, docs_dir: str | Path | None = None
) -> ValidationReport:
    """Run the box suite and the image suite over a dataset folder; one merged report. With
    ``docs_dir``, each suite's Data Docs are built under ``docs_dir/boxes`` and ``docs_dir/images``."""
    coco = load_coco(root)
    sub = (lambda name: Path(docs_dir) / name) if docs_dir is not None else (lambda name: None)
    boxes = validate_dataframe(profile_boxes(coco), load_suite_config("coco_detection", {}, config_dir), sub("boxes"))
    images = validate_dataframe(
        profile_images(coco, root), load_suite_config("coco_detection_images", {}, config_dir), sub("images")
    )
    return merge_reports("coco_detection", boxes, images)
