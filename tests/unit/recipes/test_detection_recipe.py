"""Detection records keep COCO's crowd regions and areas: trained on never, scored as COCO scores them."""

import pytest

from trainyard.evaluation.detection import coco_map
from trainyard.recipes.detection import ground_truth, training_boxes

META = {"image_size": 64, "categories": [{"id": 7, "name": "person"}, {"id": 9, "name": "dog"}]}
TARGET = {
    "image_id": 1,
    "file_name": "a.png",
    "width": 128,
    "height": 128,
    "boxes": [[10.0, 10.0, 40.0, 40.0], [70.0, 70.0, 50.0, 50.0]],
    "category_ids": [9, 7],
    "areas": [1200.0, 2000.0],
    "iscrowd": [0, 1],
}


def test_crowd_boxes_are_not_trained_on_and_boxes_are_scaled():
    boxes, labels = training_boxes(TARGET, META)
    assert boxes.tolist() == [[5.0, 5.0, 20.0, 20.0]]  # 128 px -> 64 px input
    assert labels.tolist() == [1]  # category id 9 is index 1 (ids need not be contiguous)


def test_detections_on_a_crowd_region_are_ignored_not_false_positives():
    gt = ground_truth([TARGET], META)
    assert [(a["iscrowd"], a["area"]) for a in gt["annotations"]] == [(0, 1200.0), (1, 2000.0)]
    found = [
        {"image_id": 1, "category_id": 9, "bbox": [10.0, 10.0, 40.0, 40.0], "score": 0.9},
        {"image_id": 1, "category_id": 7, "bbox": [72.0, 72.0, 45.0, 45.0], "score": 0.95},
    ]
    assert coco_map(gt, found)["map"] == pytest.approx(1.0)
    # without the crowd flag the person region is an object to find, and missing it costs AP
    plain = dict(TARGET, iscrowd=[0, 0])
    assert coco_map(ground_truth([plain], META), found[:1])["map"] < 1.0
