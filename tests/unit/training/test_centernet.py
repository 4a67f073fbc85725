"""CenterNet targets, loss and decoding: a perfect prediction decodes to the ground-truth boxes."""

import numpy as np
import pytest
import torch

from trainyard.evaluation.detection import coco_map
from trainyard.training import centernet as cn

BOXES = np.array([[4.0, 8.0, 16.0, 12.0], [30.0, 30.0, 20.0, 24.0], [40.0, 2.0, 10.0, 10.0]])
LABELS = np.array([0, 2, 2])


def _perfect_heads(boxes, labels, classes=3, grid=16):
    heat, size, offset, _ = cn.gaussian_targets(boxes, labels, classes, grid)
    logits = np.log(np.clip(heat, 1e-6, 1 - 1e-6) / (1 - np.clip(heat, 1e-6, 1 - 1e-6)))
    return logits[None], size[None], offset[None]


def test_targets_mark_each_centre():
    heat, size, offset, mask = cn.gaussian_targets(BOXES, LABELS, 3, 16)
    assert mask.sum() == 3 and (heat == 1).sum() == 3
    # box 1: centre (40, 42) px -> cell (10, 10) with no offset; size 20x24 px = 5x6 cells
    assert heat[2, 10, 10] == 1 and size[:, 10, 10].tolist() == [5.0, 6.0] and offset[:, 10, 10].tolist() == [0.0, 0.5]


def test_perfect_prediction_decodes_to_the_boxes():
    dets = cn.decode(*_perfect_heads(BOXES, LABELS), top_k=10, min_score=0.5)[0]
    assert sorted(d[0] for d in dets) == [0, 2, 2]
    found = sorted(tuple(np.round(d[2], 4)) for d in dets)
    assert found == sorted(tuple(b) for b in BOXES)


def test_perfect_prediction_scores_map_one():
    gt = {
        "images": [{"id": 1, "width": 64, "height": 64, "file_name": "a.png"}],
        "annotations": [
            {"id": i + 1, "image_id": 1, "category_id": int(c) + 1, "bbox": b.tolist()}
            for i, (b, c) in enumerate(zip(BOXES, LABELS, strict=True))
        ],
        "categories": [{"id": i + 1, "name": n} for i, n in enumerate("abc")],
    }
    dets = cn.decode(*_perfect_heads(BOXES, LABELS))[0]
    found = [{"image_id": 1, "category_id": c + 1, "bbox": b, "score": s} for c, s, b in dets]
    assert coco_map(gt, found)["map"] == pytest.approx(1.0)


def test_loss_is_lowest_for_the_right_answer_and_trains():
    torch.manual_seed(0)
    heat, size, offset, mask = (torch.from_numpy(t)[None] for t in cn.gaussian_targets(BOXES, LABELS, 3, 16))
    right = [torch.from_numpy(h) for h in _perfect_heads(BOXES, LABELS)]
    wrong = [torch.zeros_like(t) for t in right]
    # the focal loss is not 0 at the soft Gaussian targets, but far below a blank prediction's
    assert cn.loss(right, heat, size, offset, mask) * 10 < cn.loss(wrong, heat, size, offset, mask)
    model = cn.CenterNet(3, 64, width=8)
    x = torch.rand(1, 3, 64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    first = None
    for _ in range(30):
        loss = cn.loss(model(x), heat, size, offset, mask)
        first = first if first is not None else float(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < first / 2


def test_image_size_must_fit_the_stride():
    with pytest.raises(ValueError, match="multiple of 4"):
        cn.CenterNet(3, 62)


def test_a_centre_outside_the_image_gets_no_cell():
    heat, _, _, mask = cn.gaussian_targets(np.array([[-30.0, 10.0, 20.0, 20.0]]), np.array([0]), 3, 16)
    assert mask.sum() == 0 and heat.max() == 0
