import json

import numpy as np
import pytest
from PIL import Image

from trainyard.data.detection import load_coco, profile_boxes, profile_images, validate_detection


def failures(report):
    """{(expectation, column or (A, B)): unexpected_count} of every failed check."""
    out = {}
    for c in report.failed:
        col = c.kwargs.get("column") or (c.kwargs.get("column_A"), c.kwargs.get("column_B"))
        out[(c.expectation, col)] = c.unexpected_count
    return out


def make_dataset(root, annotations=None):
    """Two PNGs (32x24, 40x30) and one .npy (16x20: width 16, height 20); cats 1=cat, 2=dog."""
    (root / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((24, 32), dtype=np.uint8)).save(root / "images" / "a.png")
    Image.fromarray(np.zeros((30, 40, 3), dtype=np.uint8)).save(root / "images" / "b.png")
    np.save(root / "images" / "c.npy", np.zeros((20, 16), dtype=np.uint8))
    coco = {
        "images": [
            {"id": 1, "file_name": "a.png", "width": 32, "height": 24},
            {"id": 2, "file_name": "b.png", "width": 40, "height": 30},
            {"id": 3, "file_name": "c.npy", "width": 16, "height": 20},
        ],
        "annotations": annotations
        or [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 32, 24], "area": 768, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [4.5, 3, 10, 8], "area": 80, "iscrowd": 0},
            {"id": 3, "image_id": 2, "category_id": 2, "bbox": [30, 20, 10, 10], "area": 100, "iscrowd": 0},
            {"id": 4, "image_id": 3, "category_id": 1, "bbox": [1, 1, 15, 19], "area": 285, "iscrowd": 0},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }
    (root / "annotations.json").write_text(json.dumps(coco))
    return coco


def test_good_dataset_passes(tmp_path):
    make_dataset(tmp_path)
    coco = load_coco(tmp_path)
    boxes = profile_boxes(coco)
    assert list(boxes.columns) == [
        "annotation_id",
        "image_id",
        "category_id",
        "x",
        "y",
        "w",
        "h",
        "image_width",
        "image_height",
        "image_known",
        "category_known",
        "x_max",
        "y_max",
    ]
    assert boxes["x_max"].tolist() == [32, 14.5, 40, 16]  # boxes touching the right edge are inside
    assert profile_images(coco, tmp_path)["size_matches"].tolist() == [True, True, True]
    report = validate_detection(tmp_path)
    assert report.success, report.summary()
    assert {c.kwargs.get("column") for c in report.checks} >= {"file_exists", "category_known"}  # both suites ran


def test_corrupted_boxes_fail_with_each_breach_named(tmp_path):
    make_dataset(
        tmp_path,
        annotations=[
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 32, 24]},  # fine
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [20, 2, 20, 5]},  # right edge 40 > 32
            {"id": 3, "image_id": 2, "category_id": 2, "bbox": [5, 5, 0, 4]},  # zero width
            {"id": 4, "image_id": 2, "category_id": 7, "bbox": [5, 5, 4, 4]},  # unknown category
            {"id": 5, "image_id": 99, "category_id": 1, "bbox": [5, 5, 4, 4]},  # unknown image
        ],
    )
    report = validate_detection(tmp_path)
    assert not report.success
    assert failures(report) == {
        ("expect_column_pair_values_a_to_be_greater_than_b", ("image_width", "x_max")): 1,
        ("expect_column_values_to_be_between", "w"): 1,
        ("expect_column_values_to_be_in_set", "category_known"): 1,
        ("expect_column_values_to_be_in_set", "image_known"): 1,
    }
    text = report.summary()
    assert "1 of 5 rows fail" in text and "x_max" in text


def test_missing_file_and_wrong_declared_size_fail(tmp_path):
    make_dataset(tmp_path)
    (tmp_path / "images" / "b.png").unlink()
    coco = json.loads((tmp_path / "annotations.json").read_text())
    coco["images"][2]["width"] = 17  # c.npy is 16 wide
    (tmp_path / "annotations.json").write_text(json.dumps(coco))
    assert failures(validate_detection(tmp_path)) == {
        ("expect_column_values_to_be_in_set", "file_exists"): 1,
        ("expect_column_values_to_be_in_set", "size_matches"): 1,
    }


@pytest.mark.parametrize(
    "section, index, patch, message",
    [
        ("annotations", 1, {"bbox": [1, 2, 3]}, r"annotations\[1\] \(id=2\): bbox must be"),
        ("annotations", 0, {"bbox": None}, r"annotations\[0\] \(id=1\): bbox must be"),
        ("annotations", 2, {"image_id": "2"}, r"annotations\[2\] \(id=3\): image_id must be an integer"),
        ("images", 0, {"file_name": "../a.png"}, r"images\[0\] \(id=1\): file_name '../a.png' escapes"),
        ("images", 1, {"file_name": "/etc/passwd"}, r"images\[1\] \(id=2\): file_name '/etc/passwd' is an absolute"),
        ("images", 1, {"file_name": "C:\\x.png"}, r"images\[1\] \(id=2\).*absolute"),
    ],
)
def test_malformed_entries_named(tmp_path, section, index, patch, message):
    coco = make_dataset(tmp_path)
    coco[section][index].update(patch)
    (tmp_path / "annotations.json").write_text(json.dumps(coco))
    with pytest.raises(ValueError, match=r"annotations\.json: " + message):
        load_coco(tmp_path)


def test_missing_key_named(tmp_path):
    coco = make_dataset(tmp_path)
    del coco["images"][2]["height"]
    (tmp_path / "annotations.json").write_text(json.dumps(coco))
    with pytest.raises(ValueError, match=r"images\[2\] \(id=3\) lacks \['height'\]"):
        load_coco(tmp_path)
