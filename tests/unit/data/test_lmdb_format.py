import numpy as np
import pytest

from trainyard.data import lmdb_format


def test_round_trip(tmp_path):
    imgs = [np.full((8, 8), i, dtype=np.uint8) for i in range(5)]
    records = [(f"k{i}", i % 3, img) for i, img in enumerate(imgs)]
    assert lmdb_format.write(tmp_path / "d.lmdb", records, {"pixel_max": 16}) == 5
    keys, labels, images, meta = lmdb_format.read(tmp_path / "d.lmdb")
    assert keys == [f"k{i}" for i in range(5)]
    assert labels.tolist() == [0, 1, 2, 0, 1]
    assert np.array_equal(images[3], imgs[3])
    assert meta == {"pixel_max": 16}


def test_corrupt_record_names_the_record(tmp_path):
    import lmdb

    path = tmp_path / "d.lmdb"
    lmdb_format.write(path, [("k0", 1, np.zeros((2, 2), np.uint8))], {})
    env = lmdb.open(str(path), lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"k0", b"\x01\x00\x00\x00\x00\x00\x00\x00garbage")
    env.close()
    with pytest.raises(ValueError, match="record 'k0'"):
        lmdb_format.read(path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not an LMDB dataset"):
        lmdb_format.read(tmp_path / "nothing")
