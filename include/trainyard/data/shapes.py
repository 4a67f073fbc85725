"""The built-in detection dataset: images of simple shapes with COCO JSON annotations, made here.

Each image is ``size`` x ``size`` RGB PNG on a noisy background with 1..``max_objects`` filled shapes
(square, circle, triangle) of random colour and size, placed so that no two overlap by more than
IoU 0.2. The boxes are the shapes' exact pixel extents. Everything follows from the seed, so the same
arguments always give the same bytes, hence the same dataset commit.

The output is the COCO layout that ``trainyard.data.detection`` reads and validates (annotations.json +
images/), so the built-in source and a user's own COCO data take the same path.
"""

from __future__ import annotations

import io
import json

import numpy as np

from trainyard.data.store import Commit, generator_metadata, ingest_files

CATEGORIES = ("square", "circle", "triangle")


def _iou(a, b) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def _draw(draw, kind: str, x: int, y: int, s: int, colour) -> None:
    if kind == "square":
        draw.rectangle([x, y, x + s - 1, y + s - 1], fill=colour)
    elif kind == "circle":
        draw.ellipse([x, y, x + s - 1, y + s - 1], fill=colour)
    else:
        draw.polygon([(x + (s - 1) / 2, y), (x, y + s - 1), (x + s - 1, y + s - 1)], fill=colour)


def _extent(mask: np.ndarray) -> list[float] | None:
    """The [x, y, w, h] pixel box of a drawn mask (what the annotation must say, whatever Pillow rounded)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)]


def generate(
    n_images: int = 600, size: int = 64, max_objects: int = 3, min_side: int = 10, max_side: int = 26, seed: int = 0
) -> dict[str, bytes]:
    """The dataset files: ``annotations.json`` and ``images/shapes-NNNNN.png``."""
    from PIL import Image, ImageDraw

    if not 1 <= min_side <= max_side <= size:
        raise ValueError(f"need 1 <= min_side <= max_side <= size, got {min_side}, {max_side}, {size}")
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    images: list[dict] = []
    annotations: list[dict] = []
    for i in range(n_images):
        name = f"shapes-{i:05d}.png"
        background = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
        canvas = Image.fromarray(background, "RGB")
        placed: list[list[float]] = []
        for _ in range(int(rng.integers(1, max_objects + 1))):
            for _attempt in range(20):
                s = int(rng.integers(min_side, max_side + 1))
                x, y = (int(v) for v in rng.integers(0, size - s + 1, size=2))
                if all(_iou([x, y, s, s], p) <= 0.2 for p in placed):
                    break
            else:
                continue  # no room left in this image
            cat = int(rng.integers(len(CATEGORIES)))
            colour = tuple(int(c) for c in rng.integers(120, 256, size=3))
            mask = Image.new("L", (size, size), 0)
            _draw(ImageDraw.Draw(mask), CATEGORIES[cat], x, y, s, 255)
            box = _extent(np.asarray(mask) > 0)
            if box is None:
                continue
            canvas.paste(Image.new("RGB", (size, size), colour), mask=mask)
            placed.append([x, y, s, s])
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": cat + 1,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
        buf = io.BytesIO()
        canvas.save(buf, format="PNG", optimize=False)
        files[f"images/{name}"] = buf.getvalue()
        images.append({"id": i + 1, "file_name": name, "width": size, "height": size})
    coco = {
        "info": {"description": "trainyard synthetic shapes", "seed": seed},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CATEGORIES)],
    }
    files["annotations.json"] = json.dumps(coco, indent=1).encode()
    return files


def ingest_shapes(store, repo: str, branch: str = "main", **kwargs) -> Commit:
    """Generate the shapes dataset into ``repo``/``branch``; identical bytes commit nothing new."""
    metadata = generator_metadata(__name__, kwargs)
    return ingest_files(store, repo, branch, generate(**kwargs), "ingest synthetic shapes (COCO)", metadata)
