"""`trainyard data import image-folder|csv`: the common image layouts into a folder per class, checked
before anything is written, then validated like an upload."""

import json

import pytest

from trainyard.cli import main as cli
from trainyard.data import photos
from trainyard.data.image_folder import scan
from trainyard.data.importers.image_folder import import_labels_csv, plan_folders


@pytest.fixture(scope="module")
def images():
    return photos.photo_files(per_class=4, seed=3)  # {"<class>/<class>-<i>.jpg": bytes}


def _write(root, files):
    for rel, blob in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(blob)
    return root


def test_class_folders_import_as_they_are_and_validate(tmp_path, images, capsys):
    src = _write(tmp_path / "src", {**images, "rings/.DS_Store": b"\0", "spots/notes.txt": b"x", "top.jpg": b"x"})
    assert cli(["data", "import", "image-folder", str(src), "--dest", str(tmp_path / "ds")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"] == "classes" and summary["images"] == 16 and summary["classes"] == 4
    assert summary["skipped"] == 3  # the hidden file, the text file, the image outside a class
    assert sorted(s.key for s in scan(tmp_path / "ds").samples) == sorted(images)


def test_split_folders_keep_the_split_in_the_key(tmp_path, images):
    tree = {}
    for i, (rel, blob) in enumerate(sorted(images.items())):
        cls, name = rel.split("/")
        tree[f"{'train' if i % 4 else 'val'}/{cls}/{name}"] = blob
    tree["train/checks/checks-0000.jpg"] = images["checks/checks-0001.jpg"]  # the same name in two splits
    plan, skipped, layout = plan_folders(_write(tmp_path / "src", tree))
    assert layout == "splits" and not skipped
    assert {"checks/val/checks-0000.jpg", "checks/train/checks-0000.jpg"} <= set(plan)
    assert {k.split("/")[0] for k in plan} == set(photos.CLASSES)


def test_a_csv_of_labels(tmp_path, images):
    flat = _write(tmp_path / "flat", {rel.split("/")[1]: blob for rel, blob in images.items()})
    rows = ["Image,Label"] + [f"{rel.split('/')[1].rsplit('.', 1)[0]},{rel.split('/')[0]}" for rel in images]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")  # ids without extensions, as Kaggle's are
    summary = import_labels_csv(tmp_path / "labels.csv", flat, tmp_path / "ds")
    assert summary == {"layout": "csv", "images": 16, "classes": 4, "skipped": 0, "skipped_examples": []}
    assert sorted(s.key for s in scan(tmp_path / "ds").samples) == sorted(images)


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ("../outside.jpg,cat", "is not a file inside"),
        ("a.jpg,../up", "cannot be a class folder name"),
        ("a.jpg,.hidden", "cannot be a class folder name"),
        ("missing.jpg,cat", "'missing.jpg' not found"),
    ],
)
def test_a_hostile_or_wrong_csv_is_refused_before_writing(tmp_path, images, row, error):
    flat = _write(tmp_path / "flat", {"a.jpg": images["rings/rings-0000.jpg"]})
    (tmp_path / "outside.jpg").write_bytes(images["rings/rings-0001.jpg"])
    (tmp_path / "labels.csv").write_text(f"file,label\n{row}\n")
    with pytest.raises(ValueError, match=error):
        import_labels_csv(tmp_path / "labels.csv", flat, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_csv_needs_known_columns_and_images(tmp_path, capsys):
    (tmp_path / "labels.csv").write_text("name,tag\na.jpg,cat\n")
    with pytest.raises(ValueError, match="needs a file column"):
        import_labels_csv(tmp_path / "labels.csv", tmp_path, tmp_path / "ds")
    assert cli(["data", "import", "csv", str(tmp_path / "labels.csv"), "--dest", str(tmp_path / "ds")]) != 0
    assert "needs --images" in capsys.readouterr().err


def test_symlinks_are_not_followed(tmp_path, images):
    flat = _write(tmp_path / "flat", {"a.jpg": images["rings/rings-0000.jpg"]})
    (tmp_path / "secret.jpg").write_bytes(images["rings/rings-0001.jpg"])
    (flat / "b.jpg").symlink_to(tmp_path / "secret.jpg")
    (tmp_path / "labels.csv").write_text("file,label\na,cat\nb,dog\n")  # "b" finds b.jpg by its extension
    with pytest.raises(ValueError, match="'b.jpg' is not a file inside .* symlink"):
        import_labels_csv(tmp_path / "labels.csv", flat, tmp_path / "ds")
