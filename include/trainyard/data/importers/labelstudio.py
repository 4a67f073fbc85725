"""Import a Label Studio JSON export into the detection (COCO) or image-classification layout.

Assumptions about the export (Label Studio "JSON" export, not "JSON-MIN"), written from its documented
format rather than read from a live instance:

* The file is a list of tasks ``{"id": int, "data": {"image": ref, ...}, "annotations": [...], ...}``.
  ``ref`` is what Label Studio serves the image from: ``/data/upload/<project>/<8 hex>-<name>`` for
  uploads, ``/data/local-files/?d=<path>`` for local storage, or a URL (``s3://``, ``https://``). Only the
  file name is used; it is looked up in ``images_dir`` as is, then without the ``<8 hex>-`` prefix that
  uploads get, so a folder of the original files works too.
* ``annotations`` holds one entry per annotator submission, each with a ``result`` list. Cancelled
  (skipped) submissions, ``was_cancelled: true``, are ignored; of the rest, the first is used. A task
  with none left is skipped and counted. Predictions are ignored.
* Detection: results of ``type: "rectanglelabels"`` with ``value = {x, y, width, height, rotation,
  rectanglelabels: [name]}``. x, y, width and height are PERCENT (0-100) of ``original_width`` /
  ``original_height``, (x, y) the top-left corner. Rotated boxes and boxes with several labels cannot be
  written as COCO boxes and are refused. An annotation with an empty result is an image with no objects.
* Classification: one result of ``type: "choices"`` with ``value.choices = [name]``. Several choices
  (multi-label) are refused: the classification layout has one label per sample. An empty result (no
  choice made) is skipped and counted like a task without annotations.
* Any other result type (polygons, text areas, relations...) is refused rather than silently dropped.

Sample identity: a sample is keyed by the SHA-256 of its image file's bytes (classification key
``img-<16 hex>``, COCO image id = the first 52 bits of it). The split is a hash of the key, so the key must
survive a re-export: task order changes whenever a task is added or removed, task ids change when images
are imported into a new project, upload file names get a new random prefix on every re-upload, but the
image's content stays what it is. Two tasks on byte-identical images are refused (one sample twice could
land in train and val).

Categories/classes are ``labels`` in the given order if passed (any other label is refused), else the
sorted set of labels seen. Every problem is raised as ValueError naming the task id, before anything is
written.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, unquote, urlparse

import numpy as np

from trainyard.data.importers.coco import prepare_dest

_RESULT_TYPE = {"detection": "rectanglelabels", "classification": "choices"}
_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-(.+)$")  # Label Studio prepends 8 hex chars to uploads


@dataclass
class _Task:
    id: object
    path: Path  # the image in images_dir
    digest: str  # SHA-256 of the image file: the sample's identity (see the module docstring)
    size: tuple[int, int]  # (width, height) of the file
    labels: list[str] = field(default_factory=list)  # one per box (detection) or exactly one (classification)
    boxes: list[list[float]] = field(default_factory=list)  # COCO [x, y, w, h] in pixels


def _image_file(ref, images_dir: Path, tid) -> Path:
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"Label Studio task {tid}: data has no 'image' reference (only image tasks are supported)")
    parsed = urlparse(ref)
    query = parse_qs(parsed.query)
    name = PurePosixPath(query["d"][0] if "d" in query else unquote(parsed.path)).name
    if name in ("", ".", ".."):
        raise ValueError(f"Label Studio task {tid}: cannot take a file name from {ref!r}")
    candidates = [name]
    if m := _UPLOAD_PREFIX.match(name):
        candidates.append(m.group(1))
    for candidate in candidates:
        if (images_dir / candidate).is_file():
            return images_dir / candidate
    raise ValueError(f"Label Studio task {tid}: image {ref!r} not found in {images_dir} (tried {candidates})")


def sample_key(digest: str) -> str:
    """The classification key of an image with content SHA-256 ``digest``."""
    return f"img-{digest[:16]}"


def image_id_of(digest: str) -> int:
    """The COCO image id of an image with content SHA-256 ``digest``: 52 bits, exact as a float too."""
    return int(digest[:13], 16)


def _pixels(value: dict, width: int, height: int) -> list[float]:
    """Percent box -> COCO pixel box. Computed from the corners so that a box reaching 100% ends exactly
    on the image edge; rounded to 1e-4 px to keep float noise out of the JSON."""
    x0 = round(value["x"] * width / 100, 4)
    y0 = round(value["y"] * height / 100, 4)
    x1 = round((value["x"] + value["width"]) * width / 100, 4)
    y1 = round((value["y"] + value["height"]) * height / 100, 4)
    return [x0, y0, round(x1 - x0, 4), round(y1 - y0, 4)]


def _parse_task(task, images_dir: Path, kind: str) -> _Task | None:
    if not isinstance(task, dict):
        raise ValueError(f"Label Studio export: task entry is not an object: {str(task)[:80]}")
    tid = task.get("id")
    if not isinstance(tid, int) or isinstance(tid, bool):  # ids name errors and classification keys
        raise ValueError(f"Label Studio export: task without an integer id: {str(task)[:80]}")
    submitted = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    if not submitted:
        return None
    results = submitted[0].get("result") or []
    if kind == "classification" and not results:
        return None
    path = _image_file((task.get("data") or {}).get("image"), images_dir, tid)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            size = img.size
    except (OSError, UnidentifiedImageError) as exc:
        raise ValueError(f"Label Studio task {tid}: cannot read image {path.name}: {exc}") from None
    parsed = _Task(tid, path, digest, size)
    for r in results:
        rtype = r.get("type")
        if rtype != _RESULT_TYPE[kind]:
            raise ValueError(
                f"Label Studio task {tid}: result type {rtype!r} is not supported for {kind} "
                f"(expected {_RESULT_TYPE[kind]!r})"
            )
        value = r.get("value") or {}
        names = value.get(rtype)
        if not isinstance(names, list) or len(names) != 1:
            raise ValueError(f"Label Studio task {tid}: expected exactly one of value.{rtype}, got {names!r}")
        parsed.labels.append(names[0])
        if kind == "detection":
            if any(k not in value for k in ("x", "y", "width", "height")):
                raise ValueError(f"Label Studio task {tid}: rectangle lacks x/y/width/height: {value}")
            if value.get("rotation", 0):
                raise ValueError(f"Label Studio task {tid}: rotated box ({value['rotation']} deg) has no COCO form")
            # percent boxes are relative to the size Label Studio saw; a different file size (e.g. the
            # wrong file, or EXIF rotation) would make every pixel box wrong
            seen = (r.get("original_width"), r.get("original_height"))
            if seen != parsed.size:
                raise ValueError(
                    f"Label Studio task {tid}: original size {seen} differs from {parsed.path.name} {parsed.size}"
                )
            parsed.boxes.append(_pixels(value, *parsed.size))
    if kind == "classification" and len(parsed.labels) != 1:
        raise ValueError(f"Label Studio task {tid}: {len(parsed.labels)} choices results; expected one")
    return parsed


def import_labelstudio(
    export_json_path: str | Path,
    images_dir: str | Path,
    dest_dir: str | Path,
    kind: str,
    labels: list[str] | None = None,
) -> dict:
    """Convert a Label Studio JSON export into ``dest_dir`` (see the module docstring for the format).

    kind="detection": writes the COCO layout of trainyard.data.detection (images copied unchanged, image
    ids from the content digest, annotation ids numbered from 1). Returns {tasks, skipped, images,
    annotations, categories}.
    kind="classification": writes the layout of trainyard.data.classification, each image converted to
    uint8 grayscale with Pillow, key ``img-<digest>``, ``pixel_max`` 255 and height/width of the first
    image (differing sizes are left for the validation suite to report). Returns {tasks, skipped,
    samples, classes}.
    """
    if kind not in _RESULT_TYPE:
        raise ValueError(f"kind must be one of {sorted(_RESULT_TYPE)}, got {kind!r}")
    src = Path(export_json_path)
    try:
        tasks = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{src}: cannot read Label Studio export: {exc}") from None
    if not isinstance(tasks, list):
        raise ValueError(f"{src}: expected a list of tasks (the JSON export), got {type(tasks).__name__}")
    parsed = [p for p in (_parse_task(t, Path(images_dir), kind) for t in tasks) if p is not None]

    names = list(labels) if labels is not None else sorted({n for p in parsed for n in p.labels})
    for p in parsed:
        unknown = sorted(set(p.labels) - set(names))
        if unknown:
            raise ValueError(f"Label Studio task {p.id}: unknown label(s) {unknown}; known: {names}")
    seen: dict[str, object] = {}
    for p in parsed:  # two tasks on one file would give one image two, possibly conflicting, entries
        if p.path.name in seen:
            raise ValueError(f"Label Studio task {p.id}: image {p.path.name} already used by task {seen[p.path.name]}")
        seen[p.path.name] = p.id
    by_content: dict[str, _Task] = {}
    for p in parsed:
        # a 52-bit prefix names COCO images: refusing equal prefixes covers equal content and the
        # (astronomically rare) prefix collision alike
        other = by_content.setdefault(p.digest[:13], p)
        if other is not p:
            raise ValueError(
                f"Label Studio task {p.id}: image {p.path.name} has the same content as task "
                f"{other.id}'s {other.path.name}; remove one of the two tasks"
            )

    counts = {"tasks": len(tasks), "skipped": len(tasks) - len(parsed)}
    dest = prepare_dest(dest_dir)
    if kind == "detection":
        return counts | _write_coco(parsed, names, dest)
    return counts | _write_classification(parsed, names, dest)


def _write_coco(parsed: list[_Task], names: list[str], dest: Path) -> dict:
    cat_id = {n: i for i, n in enumerate(names, start=1)}  # COCO category ids conventionally start at 1
    coco = {"images": [], "annotations": [], "categories": [{"id": cat_id[n], "name": n} for n in names]}
    for p in parsed:
        image_id = image_id_of(p.digest)
        shutil.copyfile(p.path, dest / "images" / p.path.name)
        coco["images"].append({"id": image_id, "file_name": p.path.name, "width": p.size[0], "height": p.size[1]})
        for label, box in zip(p.labels, p.boxes, strict=True):
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": cat_id[label],
                    "bbox": box,
                    "area": round(box[2] * box[3], 4),
                    "iscrowd": 0,
                }
            )
    (dest / "annotations.json").write_text(json.dumps(coco, indent=1), encoding="utf-8")
    return {"images": len(coco["images"]), "annotations": len(coco["annotations"]), "categories": len(names)}


def _write_classification(parsed: list[_Task], names: list[str], dest: Path) -> dict:
    from PIL import Image

    rows = ["key,label"]
    shape = None
    for p in parsed:
        with Image.open(p.path) as img:
            arr = np.asarray(img.convert("L"), dtype=np.uint8)
        shape = shape or arr.shape
        key = sample_key(p.digest)
        np.save(dest / "images" / f"{key}.npy", arr, allow_pickle=False)
        rows.append(f"{key},{names.index(p.labels[0])}")
    (dest / "labels.csv").write_text("\n".join(rows) + "\n")
    height, width = shape or (0, 0)
    meta = {"classes": names, "height": int(height), "width": int(width), "pixel_max": 255}
    (dest / "classes.json").write_text(json.dumps(meta, indent=1))
    return {"samples": len(parsed), "classes": len(names)}
