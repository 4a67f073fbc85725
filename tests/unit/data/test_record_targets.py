"""Records that carry a target beyond the label (detection boxes, sentence pairs), in both formats."""

import numpy as np
import pytest

from trainyard.data import formats


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_targets_and_colour_images_round_trip(tmp_path, fmt):
    rgb = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    records = [
        ("a", 0, rgb, {"boxes": [[1.0, 2.0, 3.0, 4.0]], "labels": [2]}),
        ("b", 0, rgb[::-1].copy(), None),  # a record may have no target
        ("c", 0, rgb, {"source": "der Hund", "target": "the dog"}),
    ]
    path = tmp_path / formats.filename("train", fmt)
    assert formats.write(fmt, path, records, {"kind": "test"}) == 3
    keys, _, images, meta = formats.read(fmt, path)
    assert keys == ["a", "b", "c"] and meta == {"kind": "test"}
    assert images.shape == (3, 4, 5, 3) and np.array_equal(images[1], rgb[::-1])
    assert formats.read_with_targets(fmt, path)[4] == [records[0][3], None, records[2][3]]


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_plain_records_have_no_targets(tmp_path, fmt):
    path = tmp_path / formats.filename("val", fmt)
    formats.write(fmt, path, [("k", 1, np.zeros((2, 2), np.uint8))], {})
    assert formats.read_with_targets(fmt, path)[4] == [None]


def test_any_sample_key_is_allowed(tmp_path):
    """Sample keys live inside the records, so none is reserved (LMDB's own keys are indexes)."""
    path = tmp_path / "x.lmdb"
    formats.write("lmdb", path, [("__trainyard_meta__", 0, np.zeros((1, 1), np.uint8))], {"m": 1})
    keys, _, _, meta = formats.read("lmdb", path)
    assert keys == ["__trainyard_meta__"] and meta == {"m": 1}


@pytest.mark.parametrize("fmt", ["lmdb", "tfrecord"])
def test_encoded_image_files_round_trip(tmp_path, fmt):
    """The image-folder records: a file's bytes, any length, kept as they are (TFRecord: image/encoded)."""
    files = [np.frombuffer(b"\xff\xd8jpeg bytes", np.uint8), np.frombuffer(b"\x89PNG longer bytes", np.uint8)]
    path = tmp_path / formats.filename("train", fmt)
    formats.write(fmt, path, [("cat/a.jpg", 0, files[0]), ("dog/b.png", 1, files[1])], {"kind": "image_folder"})
    batch = formats.open_records(fmt, path).batch([1, 0])
    assert [a.tobytes() for a in batch.arrays] == [files[1].tobytes(), files[0].tobytes()]
    assert batch.keys == ["dog/b.png", "cat/a.jpg"] and batch.labels.tolist() == [1, 0]
