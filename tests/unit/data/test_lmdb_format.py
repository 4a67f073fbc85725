import numpy as np
import pytest

from trainyard.data import formats, lmdb_format


def test_round_trip(tmp_path):
    imgs = [np.full((8, 8), i, dtype=np.uint8) for i in range(5)]
    records = [(f"k{i}", i % 3, img) for i, img in enumerate(imgs)]
    assert lmdb_format.write(tmp_path / "d.lmdb", records, {"pixel_max": 16}) == 5
    keys, labels, images, meta = formats.read("lmdb", tmp_path / "d.lmdb")
    assert keys == [f"k{i}" for i in range(5)]
    assert labels.tolist() == [0, 1, 2, 0, 1]
    assert np.array_equal(images[3], imgs[3])
    assert meta == {"pixel_max": 16}


def test_dtypes_byte_order_and_shapes_survive(tmp_path):
    records = [
        ("be", 1, np.array([[1, 65535], [256, 2]], dtype=">u2")),  # big-endian in, native out
        ("f", 2, np.linspace(0, 1, 6, dtype=np.float32).reshape(1, 2, 3)),
        ("empty", 3, np.zeros((0, 0), dtype=np.uint8)),  # text records carry no array
        ("bytes", 4, np.frombuffer(b"\xff\xd8 a jpeg", dtype=np.uint8)),
    ]
    lmdb_format.write(tmp_path / "d.lmdb", records, {})
    batch = lmdb_format.Reader(tmp_path / "d.lmdb").batch([3, 0, 1, 2])
    assert batch.keys == ["bytes", "be", "f", "empty"] and batch.labels.tolist() == [4, 1, 2, 3]
    assert isinstance(batch.arrays, list)  # shapes differ: not stacked
    be, f, empty = batch.arrays[1:]
    assert be.dtype == np.uint16 and be.tolist() == [[1, 65535], [256, 2]]
    assert f.dtype == np.float32 and np.array_equal(f, records[1][2]) and empty.shape == (0, 0)
    assert batch.arrays[0].tobytes() == b"\xff\xd8 a jpeg"


def test_streamed_write_commits_in_pieces_and_grows_the_map(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_format, "COMMIT_BYTES", 50_000)  # many transactions
    monkeypatch.setattr(lmdb_format, "INITIAL_MAP_BYTES", 1 << 20)  # grown several times
    rng = np.random.default_rng(0)
    records = ((f"k{i:04d}", i, rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for i in range(2000))
    assert lmdb_format.write(tmp_path / "big.lmdb", records, {"n": 2000}) == 2000
    reader = lmdb_format.Reader(tmp_path / "big.lmdb")
    assert len(reader) == 2000 and reader.meta == {"n": 2000}
    batch = reader.batch([1999, 0, 1000])
    assert batch.keys == ["k1999", "k0000", "k1000"] and batch.arrays.shape == (3, 64, 64, 3)
    assert (tmp_path / "big.lmdb" / "data.mdb").stat().st_size > 16 << 20  # 24 MB of arrays: the map grew


def test_out_of_range_index(tmp_path):
    lmdb_format.write(tmp_path / "d.lmdb", [("k0", 1, np.zeros((2, 2), np.uint8))], {})
    with pytest.raises(IndexError, match="record 1 out of range"):
        lmdb_format.Reader(tmp_path / "d.lmdb").batch([1])


def test_reader_survives_pickling_into_another_process(tmp_path):
    import multiprocessing as mp

    lmdb_format.write(tmp_path / "d.lmdb", [(f"k{i}", i, np.full((2, 2), i, np.uint8)) for i in range(4)], {})
    reader = lmdb_format.Reader(tmp_path / "d.lmdb")
    reader.batch([0])  # opened here first: the child must open its own handle
    for method, indices in (("spawn", [3, 1]), ("fork", [2])):
        pool = mp.get_context(method).Pool(1)
        try:
            assert pool.apply(_labels_of, (reader, indices)) == indices
        finally:
            # close and join, not terminate (the context manager's exit): a forked worker inherits this
            # process's Python-level SIGTERM handler (an earlier dag.test() in this pytest worker installs
            # one), which a worker blocked in a lock never runs, so terminate() would wait for it forever
            pool.close()
            pool.join()


def _labels_of(reader, indices):
    return reader.batch(indices).labels.tolist()


def test_corrupt_record_names_the_record(tmp_path):
    import lmdb

    path = tmp_path / "d.lmdb"
    lmdb_format.write(path, [("k0", 1, np.zeros((2, 2), np.uint8))], {})
    env = lmdb.open(str(path), lock=False)
    with env.begin(write=True) as txn:
        good = bytes(txn.get(lmdb_format.index_key(0)))
        txn.put(lmdb_format.index_key(0), good[:-1])  # one array byte short
    env.close()
    with pytest.raises(ValueError, match=r"d\.lmdb record 0: corrupt record: array of \(2, 2\) uint8 needs 4 bytes"):
        formats.read("lmdb", path)


def test_missing_file_and_cut_short_file(tmp_path):
    import lmdb

    with pytest.raises(ValueError, match="not an LMDB dataset"):
        formats.read("lmdb", tmp_path / "nothing")
    env = lmdb.open(str(tmp_path / "cut.lmdb"), lock=False)  # records but no meta: a write that died
    with env.begin(write=True) as txn:
        txn.put(lmdb_format.index_key(0), lmdb_format.encode("k", 0, np.zeros((1,), np.uint8)))
    env.close()
    with pytest.raises(ValueError, match="no __trainyard_meta__ record"):
        formats.read("lmdb", tmp_path / "cut.lmdb")
