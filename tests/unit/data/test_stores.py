import json

import numpy as np
import pytest

from trainyard.cli import main as cli
from trainyard.data import stores
from trainyard.data.store import LocalStore, StoreError


def test_local_by_default_under_trainyard_home(trainyard_home):
    store = stores.open_store("local")
    assert isinstance(store, LocalStore) and store.root == trainyard_home / "datasets"


def test_lakefs_prefers_env_then_registered_factory(monkeypatch):
    for name in ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(stores, "_factories", {})
    with pytest.raises(StoreError, match="LAKEFS_ENDPOINT"):
        stores.open_store("lakefs")
    sentinel = object()
    stores.register("lakefs", lambda: sentinel)
    assert stores.open_store("lakefs") is sentinel
    monkeypatch.setenv("LAKEFS_ENDPOINT", "http://lakefs.invalid:8000")
    monkeypatch.setenv("LAKEFS_ACCESS_KEY_ID", "AKIA")
    monkeypatch.setenv("LAKEFS_SECRET_ACCESS_KEY", "secret")
    store = stores.open_store("lakefs")
    assert store.kind == "lakefs" and store.uri("imgs", "main", "a/b") == "lakefs://imgs/main/a/b"


def test_unknown_store():
    with pytest.raises(ValueError, match="allowed"):
        stores.open_store("s3")


def test_cli_import_coco_validates(tmp_path, capsys):
    images = tmp_path / "img"
    images.mkdir()
    np.save(images / "a.npy", np.zeros((20, 30), dtype=np.uint8))
    coco = {
        "images": [{"id": 1, "file_name": "a.npy", "width": 30, "height": 20}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 3, 10, 5], "area": 50, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "box"}],
    }
    (tmp_path / "export.json").write_text(json.dumps(coco))
    dest = tmp_path / "ds"
    assert (
        cli(["data", "import", "coco", str(tmp_path / "export.json"), "--images", str(images), "--dest", str(dest)])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"images": 1, "annotations": 1, "categories": 1}
    coco["annotations"][0]["bbox"] = [25, 3, 10, 5]  # runs off the right edge
    (tmp_path / "export.json").write_text(json.dumps(coco))
    assert (
        cli(
            [
                "data",
                "import",
                "coco",
                str(tmp_path / "export.json"),
                "--images",
                str(images),
                "--dest",
                str(tmp_path / "ds2"),
            ]
        )
        == 1
    )
    assert "FAILED" in capsys.readouterr().err


def test_cli_data_log_prints_the_history_newest_first(trainyard_home, capsys, login_as):
    """As `git log` and `lakectl log` do: every commit of the ref by default, at most N with -n."""
    from trainyard.data.ownership import OWNER_KEY
    from trainyard.data.store import LocalStore

    store = LocalStore(trainyard_home / "datasets")
    store.create_repo("pets", metadata={OWNER_KEY: "vision"})
    login_as("alice")  # of team vision
    first = store.commit_files("pets", "main", {"a.txt": b"1"}, "first")
    second = store.commit_files("pets", "main", {"b.txt": b"2"}, "second")
    assert cli(["data", "log", "--repo", "pets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines][:2] == [[second.id, "second"], [first.id, "first"]]
    assert cli(["data", "log", "--repo", "pets", "-n", "1"]) == 0
    assert capsys.readouterr().out.split()[:2] == [second.id, "second"]
