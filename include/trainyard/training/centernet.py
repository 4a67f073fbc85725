"""A small CenterNet ("Objects as Points", Zhou et al. 2019) for the detection recipe.

The network maps an (N, 3, S, S) image in [0, 1] to three maps on a grid of stride 4:

* ``heatmap``: (N, C, S/4, S/4) logits, one channel per category, peaking at object centres;
* ``size``: (N, 2, ...) box width and height in grid cells;
* ``offset``: (N, 2, ...) the centre's sub-cell position.

These raw maps are the model's (and the ONNX file's) outputs. ``decode`` turns them into boxes with
numpy, so PyTorch and onnxruntime results go through the very same post-processing, and a parity
check on the maps covers everything after them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

STRIDE = 4


def _block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class CenterNet(nn.Module):
    # Set by the detection recipe when it loads a model file. Declared for the type checker only: a class
    # annotation on a Module is read by TorchScript when the model is traced.
    if TYPE_CHECKING:
        categories: list[dict]

    def __init__(self, num_classes: int, image_size: int, width: int = 32) -> None:
        super().__init__()
        if image_size % STRIDE:
            raise ValueError(f"image_size must be a multiple of {STRIDE}, got {image_size}")
        self.config = {"num_classes": num_classes, "image_size": image_size, "width": width}
        w = width
        self.backbone = nn.Sequential(
            _block(3, w // 2),
            _block(w // 2, w, 2),
            _block(w, w),
            _block(w, 2 * w, 2),
            _block(2 * w, 2 * w),
            _block(2 * w, 2 * w),
        )

        def head(out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(w, out, 1))

        self.heatmap, self.size, self.offset = head(num_classes), head(2), head(2)
        # Start near "no object anywhere" (p = 0.1), as CenterNet does, or the focal loss explodes early.
        bias = self.heatmap[-1].bias
        assert isinstance(bias, torch.Tensor)  # the last Conv2d has its default bias; Module attributes are untyped
        nn.init.constant_(bias, -math.log((1 - 0.1) / 0.1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        return self.heatmap(f), self.size(f), self.offset(f)


def gaussian_targets(boxes: np.ndarray, labels: np.ndarray, num_classes: int, grid: int) -> tuple[np.ndarray, ...]:
    """Dense training targets of one image. ``boxes`` (K, 4) xywh in model-input pixels, ``labels`` (K,)
    category indices. Returns heat (C, G, G), size (2, G, G), offset (2, G, G), mask (1, G, G)."""
    heat = np.zeros((num_classes, grid, grid), np.float32)
    size = np.zeros((2, grid, grid), np.float32)
    offset = np.zeros((2, grid, grid), np.float32)
    mask = np.zeros((1, grid, grid), np.float32)
    ys, xs = np.mgrid[0:grid, 0:grid]
    for (x, y, w, h), c in zip(boxes, labels, strict=True):
        if w <= 0 or h <= 0:
            continue
        cx, cy = (x + w / 2) / STRIDE, (y + h / 2) / STRIDE
        if not (0 <= cx < grid and 0 <= cy < grid):
            continue  # a centre outside the image has no cell (validation reports such boxes)
        ix, iy = int(cx), int(cy)
        sigma = max(min(w, h) / STRIDE / 3.0, 0.5)
        g = np.exp(-((xs - ix) ** 2 + (ys - iy) ** 2) / (2 * sigma**2))
        heat[c] = np.maximum(heat[c], g)
        heat[c, iy, ix] = 1.0
        size[:, iy, ix] = (w / STRIDE, h / STRIDE)
        offset[:, iy, ix] = (cx - ix, cy - iy)
        mask[0, iy, ix] = 1.0
    return heat, size, offset, mask


def loss(outputs, heat, size, offset, mask) -> torch.Tensor:
    """Penalty-reduced focal loss on the heatmap + L1 on size (x0.1) and offset at object centres."""
    logits, size_pred, offset_pred = (o.float() for o in outputs)
    p = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1).float()
    n_pos = pos.sum().clamp(min=1.0)
    pos_loss = -(torch.log(p) * (1 - p) ** 2 * pos).sum()
    neg_loss = -(torch.log(1 - p) * p**2 * (1 - heat) ** 4 * (1 - pos)).sum()
    size_loss = (F.l1_loss(size_pred, size, reduction="none") * mask).sum() / n_pos
    offset_loss = (F.l1_loss(offset_pred, offset, reduction="none") * mask).sum() / n_pos
    return (pos_loss + neg_loss) / n_pos + 0.1 * size_loss + offset_loss


def decode(
    heatmap_logits: np.ndarray, size: np.ndarray, offset: np.ndarray, top_k: int = 50, min_score: float = 0.01
) -> list[list[tuple[int, float, list[float]]]]:
    """Per image: [(category index, score, [x, y, w, h] in model-input pixels), ...], best first.

    A detection is a local maximum of its category's heatmap (3x3 neighbourhood: CenterNet's NMS)."""
    from scipy.ndimage import maximum_filter

    heat = 1.0 / (1.0 + np.exp(-heatmap_logits.astype(np.float64)))
    peaks = heat == maximum_filter(heat, size=(1, 1, 3, 3), mode="constant", cval=0.0)
    scores = np.where(peaks, heat, 0.0)
    n, c, g, _ = scores.shape
    out = []
    for i in range(n):
        flat = scores[i].reshape(-1)
        k = min(top_k, flat.size)
        idx = np.argpartition(-flat, k - 1)[:k]
        idx = idx[np.argsort(-flat[idx], kind="stable")]
        dets = []
        for j in idx:
            score = float(flat[j])
            if score < min_score:
                break
            cat, rest = divmod(int(j), g * g)
            gy, gx = divmod(rest, g)
            w, h = (float(size[i, d, gy, gx]) * STRIDE for d in (0, 1))
            cx = (gx + float(offset[i, 0, gy, gx])) * STRIDE
            cy = (gy + float(offset[i, 1, gy, gx])) * STRIDE
            dets.append((cat, score, [cx - w / 2, cy - h / 2, max(w, 0.0), max(h, 0.0)]))
        out.append(dets)
    return out
