import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from trainyard.data.classification import load_classification, profile
from trainyard.data.detection import load_coco, validate_detection
from trainyard.data.importers import import_coco, import_labelstudio
from trainyard.data.importers.labelstudio import image_id_of, sample_key
from trainyard.data.split import assign
from trainyard.data.validation import load_suite_config, validate_dataframe


def png(path, width, height, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), value, dtype=np.uint8)).save(path)


# --- COCO ------------------------------------------------------------------------------------------------


def coco_export(tmp_path, file_names=("a.png", "train/b.png")):
    images = tmp_path / "export" / "images"
    for name in file_names:
        if ".." not in name:
            png(images / name, 32, 24)
    coco = {
        "info": {"description": "kept as is"},
        "images": [{"id": i, "file_name": n, "width": 32, "height": 24} for i, n in enumerate(file_names, start=1)],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "bbox": [1, 2, 10, 5], "area": 50, "iscrowd": 0},
            {"id": 11, "image_id": 2, "category_id": 2, "bbox": [0, 0, 32, 24]},  # no area/iscrowd
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }
    path = tmp_path / "export" / "instances.json"
    path.write_text(json.dumps(coco))
    return path, images, coco


def test_coco_round_trip(tmp_path):
    path, images, coco = coco_export(tmp_path)
    dest = tmp_path / "dataset"
    assert import_coco(path, images, dest) == {"images": 2, "annotations": 2, "categories": 2}
    loaded = load_coco(dest)
    coco["annotations"][1].update(area=768, iscrowd=0)  # filled in by the importer
    assert loaded == coco
    assert (dest / "images" / "train" / "b.png").read_bytes() == (images / "train" / "b.png").read_bytes()
    report = validate_detection(dest)
    assert report.success, report.summary()
    from pycocotools.coco import COCO  # the written file is what COCO tooling reads

    assert sorted(COCO(str(dest / "annotations.json")).getAnnIds()) == [10, 11]


def test_coco_path_traversal_refused(tmp_path):
    path, images, _ = coco_export(tmp_path, file_names=("a.png", "../../secret.png"))
    with pytest.raises(ValueError, match=r"images\[1\] \(id=2\): file_name '../../secret.png' escapes"):
        import_coco(path, images, tmp_path / "dataset")
    assert not (tmp_path / "dataset").exists()  # nothing written


def test_coco_missing_image_refused(tmp_path):
    path, images, _ = coco_export(tmp_path)
    (images / "a.png").unlink()
    with pytest.raises(ValueError, match=r"images\[0\] \(id=1\): 'a.png' not found"):
        import_coco(path, images, tmp_path / "dataset")


def test_coco_refuses_non_empty_destination(tmp_path):
    path, images, _ = coco_export(tmp_path)
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "stale.txt").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        import_coco(path, images, tmp_path / "dataset")


# --- Label Studio -----------------------------------------------------------------------------------------


def rect(x, y, w, h, label, ow, oh, **extra):
    value = {"x": x, "y": y, "width": w, "height": h, "rotation": 0, "rectanglelabels": [label]} | extra
    return {
        "id": f"r{label}{x}",
        "type": "rectanglelabels",
        "from_name": "label",
        "to_name": "image",
        "original_width": ow,
        "original_height": oh,
        "image_rotation": 0,
        "value": value,
    }


def task(tid, image, results, cancelled=False):
    return {
        "id": tid,
        "data": {"image": image},
        "annotations": [{"id": tid * 10, "result": results, "was_cancelled": cancelled}],
        "predictions": [],
    }


def ls_detection_export(tmp_path, tasks=None):
    images = tmp_path / "ls_images"
    png(images / "a.png", 200, 100)
    png(images / "b.png", 640, 480)
    png(images / "c.png", 50, 50)
    tasks = tasks or [
        # an upload: Label Studio prefixed the name; the folder holds the original file
        task(
            1,
            "/data/upload/1/8f3a2b1c-a.png",
            [
                rect(10, 20, 25, 50, "cat", 200, 100),
                rect(75, 0, 25, 100, "dog", 200, 100),  # touches the right edge exactly
            ],
        ),
        task(2, "/data/local-files/?d=photos/b.png", [rect(12.5, 25, 50, 37.5, "cat", 640, 480)]),
        {"id": 3, "data": {"image": "/data/upload/1/c.png"}, "annotations": []},  # not annotated yet
        task(4, "/data/upload/1/c.png", [rect(1, 1, 1, 1, "cat", 50, 50)], cancelled=True),  # skipped by annotator
        task(5, "s3://bucket/c.png", []),  # annotated: no objects in this image
    ]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    return path, images


def test_labelstudio_detection_percent_boxes_to_pixels(tmp_path):
    path, images = ls_detection_export(tmp_path)
    dest = tmp_path / "dataset"
    summary = import_labelstudio(path, images, dest, kind="detection")
    assert summary == {"tasks": 5, "skipped": 2, "images": 3, "annotations": 3, "categories": 2}
    coco = load_coco(dest)
    assert coco["categories"] == [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    assert [(i["file_name"], i["width"], i["height"]) for i in coco["images"]] == [
        ("a.png", 200, 100),
        ("b.png", 640, 480),
        ("c.png", 50, 50),
    ]
    # by hand: a.png 200x100: x 10% of 200 = 20, y 20% of 100 = 20, w 25% of 200 = 50, h 50% of 100 = 50
    #          a.png: x 75% = 150, y 0, w 25% = 50, h 100% = 100;  b.png 640x480: 12.5% -> 80, 25% -> 120,
    #          50% -> 320, 37.5% -> 180
    a_id, b_id = (image_id_of(hashlib.sha256((images / n).read_bytes()).hexdigest()) for n in ("a.png", "b.png"))
    assert [(a["image_id"], a["category_id"], a["bbox"], a["area"]) for a in coco["annotations"]] == [
        (a_id, 1, [20, 20, 50, 50], 2500),
        (a_id, 2, [150, 0, 50, 100], 5000),
        (b_id, 1, [80, 120, 320, 180], 57600),
    ]
    report = validate_detection(dest)
    assert report.success, report.summary()


def test_labelstudio_unknown_label_names_task(tmp_path):
    path, images = ls_detection_export(tmp_path)
    with pytest.raises(ValueError, match=r"task 1: unknown label\(s\) \['dog'\]"):
        import_labelstudio(path, images, tmp_path / "dataset", kind="detection", labels=["cat"])
    assert not (tmp_path / "dataset").exists()


@pytest.mark.parametrize(
    "result, message",
    [
        (
            {"type": "polygonlabels", "value": {"points": [], "polygonlabels": ["cat"]}},
            r"task 7: result type 'polygonlabels'",
        ),
        (rect(1, 1, 5, 5, "cat", 200, 100, rotation=30), r"task 7: rotated box"),
        (rect(1, 1, 5, 5, "cat", 100, 100), r"task 7: original size \(100, 100\) differs"),
    ],
)
def test_labelstudio_unconvertible_results_name_task(tmp_path, result, message):
    path, images = ls_detection_export(tmp_path, tasks=[task(7, "/data/upload/1/a.png", [result])])
    with pytest.raises(ValueError, match=message):
        import_labelstudio(path, images, tmp_path / "dataset", kind="detection")


def choice(name):
    return {"type": "choices", "from_name": "class", "to_name": "image", "value": {"choices": [name]}}


def test_labelstudio_classification(tmp_path):
    images = tmp_path / "ls_images"
    tasks = []
    for i in range(12):
        png(images / f"img{i}.png", 8, 6, value=10 * i)
        tasks.append(task(100 + i, f"/data/upload/2/img{i}.png", [choice("bird" if i % 3 else "fish")]))
    tasks.append({"id": 200, "data": {"image": "/data/upload/2/img0.png"}, "annotations": []})
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    dest = tmp_path / "dataset"
    summary = import_labelstudio(path, images, dest, kind="classification")
    assert summary == {"tasks": 13, "skipped": 1, "samples": 12, "classes": 2}
    meta = json.loads((dest / "classes.json").read_text())
    assert meta == {"classes": ["bird", "fish"], "height": 6, "width": 8, "pixel_max": 255}
    data = load_classification(dest)
    assert data.keys[:2] == [
        sample_key(hashlib.sha256((images / f"img{i}.png").read_bytes()).hexdigest()) for i in (0, 1)
    ]
    assert data.labels[:3].tolist() == [1, 0, 0]
    assert data.images[5].dtype == np.uint8 and data.images[5].shape == (6, 8)
    assert (data.images[5] == 50).all()  # grey RGB (50, 50, 50) -> L 50
    suite = load_suite_config(
        "image_classification", {"max_label": 1, "all_labels": [0, 1], "height": 6, "width": 8, "pixel_max": 255}
    )
    report = validate_dataframe(profile(data), suite)
    assert report.success, report.summary()


@pytest.mark.parametrize(
    "results, message",
    [
        ([choice("whale")], r"task 42: unknown label\(s\) \['whale'\]"),
        (
            [{"type": "choices", "value": {"choices": ["bird", "fish"]}}],
            r"task 42: expected exactly one of value.choices",
        ),
        ([{"type": "textarea", "value": {"text": ["note"]}}], r"task 42: result type 'textarea' is not supported"),
        ([choice("bird"), choice("fish")], r"task 42: 2 choices results"),
    ],
)
def test_labelstudio_classification_bad_input_names_task(tmp_path, results, message):
    png(tmp_path / "ls_images" / "x.png", 8, 6)
    path = tmp_path / "export.json"
    path.write_text(json.dumps([task(42, "/data/upload/2/x.png", results)]))
    with pytest.raises(ValueError, match=message):
        import_labelstudio(
            path, tmp_path / "ls_images", tmp_path / "dataset", kind="classification", labels=["bird", "fish"]
        )


def test_labelstudio_text_task_refused(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps([{"id": 9, "data": {"text": "hi"}, "annotations": [{"result": [choice("bird")]}]}]))
    with pytest.raises(ValueError, match=r"task 9: data has no 'image'"):
        import_labelstudio(path, tmp_path, tmp_path / "dataset", kind="classification")


def _reexport(tmp_path, kind, new_project):
    """An export of 12 images, then a re-export with one more task listed first: from the same project
    (old tasks keep their ids) or from a new project the images were imported into (new ids)."""
    images = tmp_path / "ls_images"
    tasks = []
    for i in range(12):
        png(images / f"img{i}.png", 8, 6, value=10 * i)
        box = rect(0, 0, 50, 50, "cat", 8, 6)
        result = [choice("bird" if i % 3 else "fish")] if kind == "classification" else [box]
        tasks.append(task(100 + i, f"/data/upload/2/img{i}.png", result))
    png(images / "new.png", 8, 6, value=255)
    first = tmp_path / "first.json"
    first.write_text(json.dumps(tasks))
    again = tmp_path / "again.json"
    added = task(500, "/data/upload/2/new.png", [choice("bird")] if kind == "classification" else [])
    if new_project:
        tasks = [dict(t, id=t["id"] + 1000) for t in tasks]
    again.write_text(json.dumps([added, *tasks]))
    return images, first, again


def _sample_ids(dest, kind):
    """image file -> the sample's key as the recipe's split sees it."""
    if kind == "classification":
        data = load_classification(dest)
        by_key = {k: i for i, k in enumerate(data.keys)}
        # the key is a content digest: map it back to the file through the image bytes
        return {k: int(data.images[by_key[k]][0, 0]) for k in data.keys}
    coco = load_coco(dest)
    return {f"image-{img['id']}": img["file_name"] for img in coco["images"]}  # the detection recipe's key


@pytest.mark.parametrize("kind", ["classification", "detection"])
@pytest.mark.parametrize("new_project", [False, True])
def test_labelstudio_keys_survive_a_reexport_with_a_task_added_first(tmp_path, kind, new_project):
    images, first, again = _reexport(tmp_path, kind, new_project)
    import_labelstudio(first, images, tmp_path / "v1", kind=kind)
    import_labelstudio(again, images, tmp_path / "v2", kind=kind)
    old, new = _sample_ids(tmp_path / "v1", kind), _sample_ids(tmp_path / "v2", kind)
    assert len(new) == len(old) + 1
    # every old sample has the same key, so the same sample, in the new import...
    assert {k: new[k] for k in old} == old
    # ...and so the same split; with keys by position the 12 samples would have been reshuffled
    for seed in range(5):
        assert {k: assign(k, 0.3, seed) for k in old} == {k: assign(k, 0.3, seed) for k in new if k in old}


def test_labelstudio_identical_images_in_two_tasks_refused(tmp_path):
    images = tmp_path / "ls_images"
    png(images / "x.png", 8, 6, value=7)
    png(images / "copy-of-x.png", 8, 6, value=7)
    path = tmp_path / "export.json"
    path.write_text(
        json.dumps(
            [
                task(1, "/data/upload/2/x.png", [choice("bird")]),
                task(2, "/data/upload/2/copy-of-x.png", [choice("fish")]),
            ]
        )
    )
    with pytest.raises(ValueError, match=r"task 2: image copy-of-x.png has the same content as task 1's x.png"):
        import_labelstudio(path, images, tmp_path / "dataset", kind="classification")
