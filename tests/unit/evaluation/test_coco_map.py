import copy

import numpy as np
import pytest

from trainyard.evaluation.detection import BACKENDS, STAT_KEYS, coco_map


def coco(boxes, categories=(1,), images=(1,), **extra):
    """boxes: [(image_id, category_id, [x, y, w, h]), ...]; extra keys go into every annotation."""
    return {
        "images": [{"id": i, "file_name": f"{i}.png", "width": 640, "height": 640} for i in images],
        "categories": [{"id": c, "name": f"c{c}"} for c in categories],
        "annotations": [
            {"id": k, "image_id": img, "category_id": cat, "bbox": list(bbox), **extra}
            for k, (img, cat, bbox) in enumerate(boxes, start=1)
        ],
    }


def det(image_id, category_id, bbox, score):
    return {"image_id": image_id, "category_id": category_id, "bbox": list(bbox), "score": score}


BOX = [0, 0, 10, 10]  # area 100: a "small" box, so map_small is defined and medium/large are None
# x shifted by 2.5: overlap 7.5*10 = 75, union 100 + 100 - 75 = 125, IoU = 75/125 = 0.6 exactly
BOX_IOU_06 = [2.5, 0, 10, 10]
FAR = [300, 300, 10, 10]  # overlaps nothing
SECOND = [100, 100, 10, 10]

# 2 ground truths, ranked detections TP (.9), FP (.8), TP (.7): precision 1, 1/2, 2/3 at recall .5, .5, 1.
# COCO interpolates (precision at recall r = best precision at recall >= r) at 101 recall points:
# r in 0.00..0.50 (51 points) -> 1, r in 0.51..1.00 (50 points) -> 2/3.
TP_FP_TP = (51 * 1 + 50 * 2 / 3) / 101

CASES = [
    # name, gt, detections, expected (None = COCOeval's -1: no ground truth in that area range)
    (
        "perfect",
        coco([(1, 1, BOX)]),
        [det(1, 1, BOX, 0.9)],
        {"map": 1.0, "map_50": 1.0, "map_75": 1.0, "map_small": 1.0, "map_medium": None, "map_large": None},
    ),
    (
        # IoU .6 clears the thresholds .50, .55, .60 and none of .65 ... .95: 3 of 10 -> mAP .3
        "iou exactly 0.6",
        coco([(1, 1, BOX)]),
        [det(1, 1, BOX_IOU_06, 0.9)],
        {"map": 0.3, "map_50": 1.0, "map_75": 0.0, "map_small": 0.3, "map_medium": None, "map_large": None},
    ),
    (
        # one ground truth; the false positive ranks first: precision 0 then 1/2 at recall 1, and the
        # interpolated precision is 1/2 at every recall point, at every IoU threshold
        "false positive ahead of the true positive",
        coco([(1, 1, BOX)]),
        [det(1, 1, FAR, 0.9), det(1, 1, BOX, 0.8)],
        {"map": 0.5, "map_50": 0.5, "map_75": 0.5, "map_small": 0.5, "map_medium": None, "map_large": None},
    ),
    (
        "TP, FP, TP interpolated",
        coco([(1, 1, BOX), (1, 1, SECOND)]),
        [det(1, 1, BOX, 0.9), det(1, 1, FAR, 0.8), det(1, 1, SECOND, 0.7)],
        {
            "map": TP_FP_TP,
            "map_50": TP_FP_TP,
            "map_75": TP_FP_TP,
            "map_small": TP_FP_TP,
            "map_medium": None,
            "map_large": None,
        },
    ),
    (
        "no detections",
        coco([(1, 1, BOX)]),
        [],
        {"map": 0.0, "map_50": 0.0, "map_75": 0.0, "map_small": 0.0, "map_medium": None, "map_large": None},
    ),
    (
        # category 2 is declared but has no ground truth; category 7 is not declared: both are left out of
        # the average, so their confident false positives change nothing
        "categories without ground truth ignored",
        coco([(1, 1, BOX)], categories=(1, 2)),
        [det(1, 1, BOX, 0.5), det(1, 2, FAR, 0.99), det(1, 7, FAR, 0.99)],
        {"map": 1.0, "map_50": 1.0, "map_75": 1.0, "map_small": 1.0, "map_medium": None, "map_large": None},
    ),
    (
        # mAP is the mean over categories: category 1 found (1.0), category 2 missed (0.0)
        "mean over categories",
        coco([(1, 1, BOX), (1, 2, SECOND)], categories=(1, 2)),
        [det(1, 1, BOX, 0.9)],
        {"map": 0.5, "map_50": 0.5, "map_75": 0.5, "map_small": 0.5, "map_medium": None, "map_large": None},
    ),
    (
        # 50x50 = 2500 px is "medium", 200x200 "large"; the miss is the large one. Over all sizes recall
        # stops at 1/2 with precision 1: recall points 0.00..0.50 (51 of 101) score 1, the rest 0
        "area ranges",
        coco([(1, 1, [0, 0, 50, 50]), (1, 1, [200, 200, 200, 200])]),
        [det(1, 1, [0, 0, 50, 50], 0.9)],
        {
            "map": 51 / 101,
            "map_50": 51 / 101,
            "map_75": 51 / 101,
            "map_small": None,
            "map_medium": 1.0,
            "map_large": 0.0,
        },
    ),
    (
        "no ground truth at all",
        coco([]),
        [det(1, 1, BOX, 0.9)],
        {k: None for k in STAT_KEYS},
    ),
    (
        # COCOeval treats a matched ground-truth id of 0 as "unmatched"; ids are renumbered so it still counts
        "annotation id 0",
        {**coco([(1, 1, BOX)]), "annotations": [{"id": 0, "image_id": 1, "category_id": 1, "bbox": BOX}]},
        [det(1, 1, BOX, 0.9)],
        {"map": 1.0, "map_50": 1.0, "map_75": 1.0, "map_small": 1.0, "map_medium": None, "map_large": None},
    ),
    (
        # a crowd region is ignored: a detection on it is neither a hit nor a false positive
        "crowd ignored",
        {
            **coco([(1, 1, BOX)]),
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 1, "bbox": BOX, "area": 100, "iscrowd": 0},
                {"id": 2, "image_id": 1, "category_id": 1, "bbox": SECOND, "area": 100, "iscrowd": 1},
            ],
        },
        [det(1, 1, SECOND, 0.99), det(1, 1, BOX, 0.9)],
        {"map": 1.0, "map_50": 1.0, "map_75": 1.0, "map_small": 1.0, "map_medium": None, "map_large": None},
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, gt, detections, expected", CASES, ids=[c[0] for c in CASES])
def test_known_answers(backend, name, gt, detections, expected):
    got = coco_map(gt, detections, backend=backend)
    assert set(got) == set(STAT_KEYS)
    for key, want in expected.items():
        if want is None:
            assert got[key] is None, (name, key, got[key])
        else:
            assert got[key] == pytest.approx(want, abs=1e-12), (name, key)


def random_case(seed: int):
    """~50 boxes over 10 images and 3 categories of every size; 80% found with jitter, 15 false positives."""
    rng = np.random.default_rng(seed)
    boxes, detections = [], []
    for _ in range(50):
        img, cat = int(rng.integers(1, 11)), int(rng.integers(1, 4))
        x, y = rng.uniform(0, 300, 2)
        w, h = rng.uniform(5, 200, 2)
        boxes.append((img, cat, [float(x), float(y), float(w), float(h)]))
        if rng.random() < 0.8:
            jx, jy, jw, jh = rng.normal(0, 0.1, 4) * [w, h, w, h]
            bbox = [float(x + jx), float(y + jy), float(max(1, w + jw)), float(max(1, h + jh))]
            detections.append(det(img, cat, bbox, float(rng.random())))
    for _ in range(15):
        x, y = rng.uniform(0, 300, 2)
        w, h = rng.uniform(5, 150, 2)
        detections.append(det(int(rng.integers(1, 11)), int(rng.integers(1, 4)), [x, y, w, h], float(rng.random())))
    return coco(boxes, categories=(1, 2, 3), images=range(1, 11)), detections


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("score_decimals", [None, 1], ids=["distinct scores", "tied scores"])
def test_backends_agree(seed, score_decimals):
    gt, detections = random_case(seed)
    if score_decimals is not None:  # ties exercise both libraries' (stable) ordering of equal scores
        detections = [{**d, "score": round(d["score"], score_decimals)} for d in detections]
    a = coco_map(gt, detections, backend="pycocotools")
    b = coco_map(gt, detections, backend="faster_coco_eval")
    assert a.keys() == b.keys()
    for key in STAT_KEYS:
        assert (a[key] is None) == (b[key] is None), key
        if a[key] is not None:
            assert a[key] == pytest.approx(b[key], abs=1e-9), key
    assert 0.05 < a["map"] < 0.95  # a case that exercises matching, not a trivial 0 or 1


def test_inputs_not_modified():
    gt, detections = random_case(0)
    gt_before, dets_before = copy.deepcopy(gt), copy.deepcopy(detections)
    for backend in BACKENDS:
        coco_map(gt, detections, backend=backend)
    assert gt == gt_before and detections == dets_before


def test_silent_on_stdout(capsys):
    gt, detections = random_case(1)
    for backend in BACKENDS:
        coco_map(gt, detections, backend=backend)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "name, detections, kwargs, error",
    [
        ("unknown backend", [], {"backend": "torchmetrics"}, "backend must be one of"),
        ("missing score", [{"image_id": 1, "category_id": 1, "bbox": BOX}], {}, r"detections\[0\] lacks \['score'\]"),
        ("unknown image", [det(99, 1, BOX, 0.5)], {}, "image_id 99 is not an image"),
    ],
)
def test_rejects(name, detections, kwargs, error):
    with pytest.raises(ValueError, match=error):
        coco_map(coco([(1, 1, BOX)]), detections, **kwargs)
