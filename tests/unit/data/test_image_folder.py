"""The image-folder layout: classes from folder names, stable keys, and every check of its suites naming
the file at fault."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from trainyard.data import image_folder, photos
from trainyard.data.upload import detect_kind


def _png(array) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _folder(tmp_path, files: dict[str, bytes]):
    for rel, blob in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(blob)
    return tmp_path


def _bomb_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width`` x ``height`` pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def good_files():
    return photos.photo_files(per_class=6, seed=1)


def test_good_folder_passes_with_classes_and_keys_from_the_layout(tmp_path, good_files):
    files = dict(good_files)
    files["rings/more/nested.png"] = _png(np.zeros((20, 30, 3), np.uint8))  # sub-folders are the class's
    root = _folder(tmp_path, files)
    (root / "spots" / ".git").mkdir()  # hidden folders are not the dataset's
    (root / "spots" / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main")
    report = image_folder.validate_image_folder(root)
    assert report.success, report.summary()
    assert detect_kind(root) == "image_folder"
    keys, record, meta = image_folder.samples(root)
    assert meta == {"kind": "image_folder", "classes": ["checks", "rings", "spots", "stripes"]}
    assert sorted(keys) == sorted(files) and "rings/more/nested.png" in keys
    key, label, data, target = record("spots/spots-0004.png")
    assert (key, label, target) == ("spots/spots-0004.png", 2, None)
    assert data.dtype == np.uint8 and data.tobytes() == files["spots/spots-0004.png"]  # the file as it is
    assert image_folder.samples(root)[0] == keys  # the same upload, the same keys


def test_each_problem_is_reported_with_its_file(tmp_path, good_files):
    files = dict(good_files)
    files.update(
        {
            "notes.txt": b"not in a class",
            "rings/labels.csv": b"a,b",
            "spots/broken.jpg": b"\xff\xd8\xff\xe0 cut short",
            "spots/really-a-gif.png": b"GIF89a\x01\x00\x01\x00",
            "checks/text.jpeg": b"just text",
            "stripes/tiny.png": _png(np.zeros((4, 20, 3), np.uint8)),
            "stripes/bomb.png": _bomb_png(9000, 9000),  # 81 MP: over MAX_PIXELS, under Pillow's own limit
            "stripes/huge-bomb.png": _bomb_png(20000, 20000),  # over Pillow's limit too
            "checks/copy.jpg": good_files["rings/rings-0000.jpg"],
            "spots/again.jpg": good_files["spots/spots-0000.jpg"],
        }
    )
    root = _folder(tmp_path, files)
    (root / "empty-class").mkdir()
    report = image_folder.validate_image_folder(root)
    assert not report.success
    failed = {c.kwargs.get("column"): c for c in report.failed}
    content = {"same_content_in_another_class", "same_content_twice"}  # a file's bytes met again
    assert set(failed) == {"not_an_image", "undecodable", "too_small", "bomb", "empty", *content}
    named = {col: " ".join(map(str, c.sample)) for col, c in failed.items()}
    assert "notes.txt: outside any class folder" in named["not_an_image"]
    assert "rings/labels.csv: extension not one of" in named["not_an_image"]
    for key in ("spots/broken.jpg", "spots/really-a-gif.png", "checks/text.jpeg"):
        assert key in named["undecodable"]
    assert str(tmp_path) not in named["undecodable"]  # file names, not the server's paths
    assert "stripes/tiny.png: 20x4 < 8 px" in named["too_small"]  # width x height
    assert "stripes/bomb.png: 9000x9000 > 50000000 pixels" in named["bomb"]
    assert "stripes/huge-bomb.png" in named["bomb"] and failed["bomb"].unexpected_count == 2
    assert "checks/copy.jpg = rings/rings-0000.jpg" in named["same_content_in_another_class"]
    assert "class 'empty-class' has no image" in named["empty"]
    assert "spots/again.jpg = spots/spots-0000.jpg" in named["same_content_twice"]


def test_a_bomb_is_refused_from_its_header_without_decoding(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    path.write_bytes(_bomb_png(9000, 9000))
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("a bomb must not be decoded"))
    probe = image_folder.probe(path)
    assert probe.bomb and (probe.width, probe.height) == (9000, 9000)


def test_one_class_or_no_class_folder_is_refused(tmp_path):
    one = _folder(
        tmp_path / "one",
        {"cats/a.png": _png(np.zeros((9, 9, 3), np.uint8)), "cats/b.png": _png(np.ones((9, 9, 3), np.uint8))},
    )
    report = image_folder.validate_image_folder(one)
    assert not report.success and "expect_table_row_count_to_be_between" in report.summary()
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(_png(np.zeros((9, 9, 3), np.uint8)))
    with pytest.raises(ValueError, match="no class folders"):
        image_folder.scan(tmp_path / "flat")
