import json
import struct

import numpy as np
import pytest
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference_masked_crc32c

from trainyard.data import formats, tfrecord_format

SAMPLE_FEATURES = {"key", "label", "image/raw", "image/height", "image/width", "image/dtype"}


def _records(n=5):
    return [(f"k{i}", i % 3, np.arange(12, dtype=np.uint8).reshape(3, 4) + i) for i in range(n)]


def _write(tmp_path, n=5, meta=None):
    path = tmp_path / "train.tfrecord"
    assert tfrecord_format.write(path, _records(n), meta or {"pixel_max": 16}) == n
    return path


def _offsets(data: bytes):
    """(start, payload length) of each record, walking the framing by hand."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, n))
        pos += 8 + 4 + n + 4
    assert pos == len(data)
    return out


def test_round_trip(tmp_path):
    path = _write(tmp_path, meta={"pixel_max": 16, "classes": ["a", "b"]})
    keys, labels, images, meta = formats.read("tfrecord", path)
    assert keys == [f"k{i}" for i in range(5)]
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 2, 0, 1]
    assert images.shape == (5, 3, 4) and images.dtype == np.uint8
    for got, (_, _, want) in zip(images, _records(), strict=True):
        assert np.array_equal(got, want)
    assert meta == {"pixel_max": 16, "classes": ["a", "b"]}
    assert [p.name for p in tmp_path.iterdir()] == ["train.tfrecord"]  # no temp file left


def test_round_trip_empty_and_wider_dtype(tmp_path):
    path = tmp_path / "e.tfrecord"
    assert tfrecord_format.write(path, [], {"m": 1}) == 0
    keys, labels, images, meta = formats.read("tfrecord", path)
    assert keys == [] and labels.shape == (0,) and meta == {"m": 1}

    img = np.array([[1, 65535], [256, 2]], dtype=">u2")  # big-endian in, native out
    tfrecord_format.write(path, [("w", 7, img)], {})
    _, _, images, _ = formats.read("tfrecord", path)
    assert images.dtype == np.uint16 and images[0].tolist() == img.tolist()


def test_masked_crc32c_known_values():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    crc = 0xE3069283
    masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked == 0xC78AB0E5
    assert tfrecord_format.masked_crc32c(b"123456789") == reference_masked_crc32c(b"123456789") == 0xC78AB0E5


def test_the_crc_is_the_compiled_one():
    import google_crc32c

    assert google_crc32c.implementation == "c"  # its pure-Python fallback would be as slow as the stub


def test_masked_crc32c_matches_an_independent_implementation():
    """The compiled CRC (google-crc32c) against tensorboard's pure-Python TensorFlow stub, on lengths around
    the word and block sizes a hardware implementation treats specially."""
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 7, 8, 9, 63, 64, 65, 1000, 4096, 65537):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert tfrecord_format.masked_crc32c(data) == reference_masked_crc32c(data), n


def test_framing_is_tfrecord(tmp_path):
    data = _write(tmp_path, n=2).read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    (len_crc,) = struct.unpack_from("<I", data, 8)
    assert len_crc == reference_masked_crc32c(data[:8])
    payload = data[12 : 12 + n]
    (data_crc,) = struct.unpack_from("<I", data, 12 + n)
    assert data_crc == reference_masked_crc32c(payload)
    meta_ex = tfrecord_format.example_class().FromString(payload)
    assert set(meta_ex.features.feature) == {"__meta__"}
    assert json.loads(meta_ex.features.feature["__meta__"].bytes_list.value[0]) == {"pixel_max": 16}
    assert len(_offsets(data)) == 3  # meta + 2 samples, nothing else in the file


def test_example_wire_bytes_match_tensorflow_schema():
    # Example{features{feature{key:"a" value{int64_list{value:[1]}}}}} encoded by hand from
    # tensorflow/core/example/{example,feature}.proto, independent of the module's descriptor.
    entry = b"\x0a\x01a" + b"\x12\x05" + b"\x1a\x03" + b"\x0a\x01\x01"
    wire = b"\x0a\x0c" + b"\x0a\x0a" + entry
    Example = tfrecord_format.example_class()
    assert Example.DESCRIPTOR.full_name == "tensorflow.Example"
    ex = Example()
    ex.features.feature["a"].int64_list.value.append(1)
    assert ex.SerializeToString() == wire
    assert list(Example.FromString(wire).features.feature["a"].int64_list.value) == [1]
    # bytes_list is field 1 of Feature: feature{key:"b" value{bytes_list{value:["xy"]}}}
    entry = b"\x0a\x01b" + b"\x12\x06" + b"\x0a\x04" + b"\x0a\x02xy"
    ex = Example.FromString(b"\x0a\x0d" + b"\x0a\x0b" + entry)
    assert list(ex.features.feature["b"].bytes_list.value) == [b"xy"]


def test_sample_example_carries_documented_features(tmp_path):
    data = _write(tmp_path, n=1).read_bytes()
    start, n = _offsets(data)[1]
    ex = tfrecord_format.example_class().FromString(data[start + 12 : start + 12 + n])
    f = ex.features.feature
    assert set(f) == SAMPLE_FEATURES
    assert f["key"].bytes_list.value[0] == b"k0"
    assert list(f["label"].int64_list.value) == [0]
    assert (f["image/height"].int64_list.value[0], f["image/width"].int64_list.value[0]) == (3, 4)
    assert f["image/dtype"].bytes_list.value[0] == b"uint8"
    assert f["image/raw"].bytes_list.value[0] == bytes(range(12))


def _corrupt(path, pos, byte=None):
    data = bytearray(path.read_bytes())
    data[pos] = byte if byte is not None else data[pos] ^ 0xFF
    path.write_bytes(bytes(data))


def test_flipped_data_byte_names_file_and_record(tmp_path):
    path = _write(tmp_path)
    start, n = _offsets(path.read_bytes())[2]
    _corrupt(path, start + 12 + n // 2)
    with pytest.raises(ValueError, match=r"train\.tfrecord: record 2 has a bad data CRC") as err:
        formats.read("tfrecord", path)
    assert str(path) in str(err.value)


def test_bad_length_crc(tmp_path):
    path = _write(tmp_path)
    start, _ = _offsets(path.read_bytes())[3]
    _corrupt(path, start + 9)
    with pytest.raises(ValueError, match="record 3 has a bad length CRC"):
        formats.read("tfrecord", path)


@pytest.mark.parametrize("cut", [5, 30, -2])  # inside a header, inside data, inside the data CRC
def test_truncated_file(tmp_path, cut):
    path = _write(tmp_path)
    data = path.read_bytes()
    start, _ = _offsets(data)[-1]  # record 5: the meta record, then 5 samples
    end = start + cut if cut > 0 else len(data) + cut
    path.write_bytes(data[:end])
    with pytest.raises(ValueError, match="record 5 truncated"):
        formats.read("tfrecord", path)


def test_garbage_file(tmp_path):
    path = tmp_path / "junk.tfrecord"
    path.write_bytes(b"this is not a tfrecord file at all" * 10)
    with pytest.raises(ValueError, match=r"junk\.tfrecord: record 0 has a bad length CRC"):
        formats.read("tfrecord", path)


def test_unparseable_example_with_valid_framing(tmp_path):
    path = _write(tmp_path, n=1)
    with open(path, "ab") as out:
        out.write(tfrecord_format.frame(b"\xff\xff\xff"))
    with pytest.raises(ValueError, match="record 2: unparseable Example"):
        formats.read("tfrecord", path)


def test_bad_sample_names_the_key(tmp_path):
    ex = tfrecord_format.example_class()()
    ex.features.feature["key"].bytes_list.value.append(b"cat-17")
    ex.features.feature["image/raw"].bytes_list.value.append(b"\x00" * 5)
    path = _write(tmp_path, n=1)
    with open(path, "ab") as out:
        out.write(tfrecord_format.frame(ex.SerializeToString()))
    with pytest.raises(ValueError, match=r"record 2 \(sample 'cat-17'\): bad sample Example"):
        formats.read("tfrecord", path)


def test_missing_empty_and_meta_less_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        formats.read("tfrecord", tmp_path / "nothing.tfrecord")
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="missing the __meta__ record"):
        formats.read("tfrecord", empty)
    no_meta = tmp_path / "nometa.tfrecord"
    sample = tfrecord_format.encode("k", 1, np.zeros((2, 2), np.uint8))
    no_meta.write_bytes(tfrecord_format.frame(sample))
    with pytest.raises(ValueError, match="record 0: bad __meta__ Example"):
        formats.read("tfrecord", no_meta)


def test_failed_write_leaves_no_file(tmp_path):
    path = tmp_path / "train.tfrecord"
    bad = _records(2) + [("video", 0, np.zeros((2, 2, 3, 4), np.uint8))]
    with pytest.raises(ValueError, match=r"sample 'video': expected an \(H, W\) or \(H, W, C\) image"):
        tfrecord_format.write(path, bad, {})
    assert list(tmp_path.iterdir()) == []


def test_tensorflow_reads_it(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = _write(tmp_path, n=2)
    spec = {
        "key": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "image/raw": tf.io.FixedLenFeature([], tf.string),
    }
    dataset = tf.data.TFRecordDataset(str(path)).skip(1)  # record 0 is __meta__
    rows = list(dataset.map(lambda r: tf.io.parse_single_example(r, spec)))
    assert [r["key"].numpy() for r in rows] == [b"k0", b"k1"]
    assert tf.io.decode_raw(rows[1]["image/raw"], tf.uint8).numpy().tolist() == list(range(1, 13))
