"""Users point the detection and translation recipes at their own data: upload, pin, validate, prepare."""

import json

import pytest

from datafiles import write_files
from trainyard import pipeline
from trainyard.data import formats, shapes
from trainyard.data.ownership import OWNER_KEY
from trainyard.data.stores import open_store
from trainyard.datasets import upload

GATES = {
    "centernet_detector": [{"metric": "val_map", "min": 0.0}],
    "transformer_translator": [{"metric": "val_bleu", "min": 0.0}],
}


def _spec(recipe, repo, fmt="lmdb", **extra):
    raw = {
        "name": repo,
        "recipe": recipe,
        "dataset": {"repo": repo, "source": "none", "format": fmt},
        "gates": GATES[recipe],
        **extra,
    }
    return pipeline.validate_spec(raw)


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_own_coco_data_of_another_size(trainyard_home, tmp_path, fmt):
    # 48 px images: the recipe resizes them to its 64 px input and keeps the original boxes for scoring
    folder = write_files(tmp_path / "mine", shapes.generate(30, size=48, min_side=8, max_side=20, seed=5))
    up = upload(open_store("local"), "mycoco", "main", folder, "default")
    assert up["kind"] == "coco_detection"
    spec = _spec("centernet_detector", "mycoco", fmt)
    ds = pipeline.resolve_dataset(spec)
    assert ds.commit == up["commit"]
    assert pipeline.validate_data(spec, ds, "run-1")["success"]
    docs = list(
        (trainyard_home / "runs" / "mycoco" / "run-1" / "data_docs").glob("*/gx/uncommitted/data_docs/*/index.html")
    )
    assert len(docs) == 2  # Data Docs of the box suite and of the image suite
    data = pipeline.prepare_data(spec, ds)
    assert sum(data.counts.values()) == 30
    keys, _, images, meta = formats.read(fmt, data.train)
    assert images.shape[1:] == (64, 64, 3) and meta["image_size"] == 64
    coco = json.loads((folder / "annotations.json").read_text())
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a["bbox"])
    for key, target in zip(keys, formats.read_with_targets(fmt, data.train)[4], strict=True):
        assert key == f"image-{target['image_id']}" and (target["width"], target["height"]) == (48, 48)
        assert target["boxes"] == by_image.get(target["image_id"], [])
    # another input size is another prepared copy, never a stale cache hit
    bigger = _spec("centernet_detector", "mycoco", fmt, recipe_options={"image_size": 96})
    assert pipeline.prepare_data(bigger, ds).path != data.path


def test_own_jsonl_parallel_text(trainyard_home, tmp_path):
    rows = [{"key": i, "source": f"ich sehe {i} hunde", "target": f"i see {i} dogs"} for i in range(50)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    upload(open_store("local"), "deen", "main", folder, "default")
    spec = _spec("transformer_translator", "deen")
    ds = pipeline.resolve_dataset(spec)
    assert pipeline.validate_data(spec, ds, "run-1")["success"]
    data = pipeline.prepare_data(spec, ds)
    targets = formats.read_with_targets("lmdb", data.val)[4] + formats.read_with_targets("lmdb", data.train)[4]
    assert sorted(t["target"] for t in targets) == sorted(r["target"] for r in rows)


def test_bad_own_data_stops_before_training(trainyard_home, tmp_path):
    files = shapes.generate(10, seed=1)
    coco = json.loads(files["annotations.json"])
    coco["annotations"][0]["bbox"] = [60.0, 60.0, 30.0, 30.0]  # runs off a 64 px image
    files["annotations.json"] = json.dumps(coco).encode()
    folder = write_files(tmp_path / "bad", files)
    store = open_store("local")
    # committed without the upload gate (e.g. by another tool): the pipeline's own suite still stops it
    store.create_repo("badcoco", metadata={OWNER_KEY: "default"})
    store.upload_many(
        "badcoco",
        "main",
        {rel: p.read_bytes() for rel, p in ((str(p.relative_to(folder)), p) for p in folder.rglob("*") if p.is_file())},
    )
    store.commit("badcoco", "main", "unchecked")
    spec = _spec("centernet_detector", "badcoco")
    ds = pipeline.resolve_dataset(spec)
    with pytest.raises(pipeline.DataValidationError, match="x_max"):
        pipeline.validate_data(spec, ds, "run-1")
    # nothing else ran: there is no prepared data for this commit
    assert not list((trainyard_home / "cache" / "prepared").glob(f"{ds.commit[:16]}*"))
