"""Import a COCO export (annotations JSON + a folder of images) into the detection layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainyard.data.detection import check_coco


def prepare_dest(dest_dir: str | Path) -> Path:
    """Importers write into a new or empty folder, so no stale file from an earlier import can end up
    in the dataset."""
    dest = Path(dest_dir)
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"destination {dest} is not empty")
    (dest / "images").mkdir(parents=True, exist_ok=True)
    return dest


def import_coco(coco_json_path: str | Path, images_dir: str | Path, dest_dir: str | Path) -> dict:
    """Copy a COCO export into ``dest_dir`` as ``annotations.json`` + ``images/<file_name>``.

    Every ``file_name`` must be relative without '..' (checked by detection.check_coco) and present under
    ``images_dir``; otherwise ValueError naming the entry. Annotations lacking ``area``/``iscrowd`` get
    ``w*h`` and 0, the values pycocotools' evaluation assumes. Other keys (info, licenses, segmentation)
    are kept as they are. Returns {"images", "annotations", "categories"} counts.
    """
    src = Path(coco_json_path)
    try:
        coco = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{src}: cannot read COCO JSON: {exc}") from None
    check_coco(coco, str(src))
    images_dir = Path(images_dir)
    # check every file before writing anything, so a bad export leaves no half-imported dataset
    for i, img in enumerate(coco["images"]):
        if not (images_dir / img["file_name"]).is_file():
            raise ValueError(f"{src}: images[{i}] (id={img['id']}): {img['file_name']!r} not found in {images_dir}")
    dest = prepare_dest(dest_dir)
    for img in coco["images"]:
        target = dest / "images" / img["file_name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(images_dir / img["file_name"], target)
    for ann in coco["annotations"]:
        ann.setdefault("area", ann["bbox"][2] * ann["bbox"][3])
        ann.setdefault("iscrowd", 0)
    (dest / "annotations.json").write_text(json.dumps(coco, indent=1), encoding="utf-8")
    return {k: len(coco[k]) for k in ("images", "annotations", "categories")}
