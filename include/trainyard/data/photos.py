"""The built-in image-folder dataset: photo-like RGB images of four textures, made here.

Each class is a structure, never a colour: ``stripes`` (a wave at a random angle and frequency),
``checks`` (a rotated checkerboard), ``rings`` (concentric rings round a random centre) and ``spots``
(scattered discs). Every image gets its own two random colours (one dark, one light), a lighting
gradient, sensor noise and a random size (48 to 128 px a side, any aspect), and is saved as JPEG (every
fifth as PNG), so the classifier has to learn shapes from photo-like files of mixed sizes and formats.
Everything follows from the seed: the same arguments give the same bytes, hence the same dataset commit.
"""

from __future__ import annotations

import io

import numpy as np

from trainyard.data.store import Commit, generator_metadata, ingest_files

CLASSES = ("checks", "rings", "spots", "stripes")


def _pattern(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A (h, w) float mask in [0, 1] of the class's structure."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    angle = rng.uniform(0, np.pi)
    u = x * np.cos(angle) + y * np.sin(angle)
    v = -x * np.sin(angle) + y * np.cos(angle)
    period = rng.uniform(7, 16)
    if kind == "stripes":
        return 0.5 + 0.5 * np.sin(2 * np.pi * u / period)
    if kind == "checks":
        return ((np.floor(u / period) + np.floor(v / period)) % 2).astype(np.float64)
    if kind == "rings":
        cy, cx = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w
        return 0.5 + 0.5 * np.sin(2 * np.pi * np.hypot(y - cy, x - cx) / period)
    mask = np.zeros((h, w))
    for _ in range(int(rng.integers(6, 14))):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(3, 9)
        mask = np.maximum(mask, np.clip(r - np.hypot(y - cy, x - cx), 0, 1))
    return mask


def photo(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One (H, W, 3) uint8 image of ``kind``."""
    h, w = (int(v) for v in rng.integers(48, 129, size=2))
    mask = _pattern(kind, h, w, rng)[..., None]
    dark, light = rng.uniform(20, 100), rng.uniform(150, 240)  # contrast enough to see the structure
    a, b = (level * rng.uniform(0.55, 1.0, size=3) for level in (dark, light))  # each its own tint
    if rng.random() < 0.5:
        a, b = b, a
    image = a * (1 - mask) + b * mask
    gy, gx = rng.uniform(-0.4, 0.4, size=2)
    y, x = np.mgrid[0:h, 0:w]
    image *= (1 + gy * (y / h - 0.5) + gx * (x / w - 0.5))[..., None]  # light from one side
    image += rng.normal(0, 8, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def photo_files(per_class: int = 80, seed: int = 0) -> dict[str, bytes]:
    """The dataset's files in the image-folder layout: ``<class>/<class>-<i>.jpg`` (or ``.png``)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    for kind in CLASSES:
        for i in range(per_class):
            buf = io.BytesIO()
            image = Image.fromarray(photo(kind, rng))
            if i % 5 == 4:
                image.save(buf, format="PNG")
                files[f"{kind}/{kind}-{i:04d}.png"] = buf.getvalue()
            else:
                image.save(buf, format="JPEG", quality=int(rng.integers(80, 96)))
                files[f"{kind}/{kind}-{i:04d}.jpg"] = buf.getvalue()
    return files


def ingest_photos(store, repo: str, branch: str = "main") -> Commit:
    """Ingest the synthetic photos into ``repo``/``branch`` (same bytes, same commit)."""
    return ingest_files(store, repo, branch, photo_files(), "ingest synthetic photos", generator_metadata(__name__, {}))
