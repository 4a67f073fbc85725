import numpy as np
import pytest

from trainyard.data.classification import ClassificationData, digits_files, load_classification, profile
from trainyard.data.validation import load_suite_config, validate_dataframe

META = {"classes": [str(i) for i in range(10)], "height": 8, "width": 8, "pixel_max": 16}


def _suite():
    return load_suite_config(
        "image_classification",
        {"max_label": 9, "all_labels": list(range(10)), "height": 8, "width": 8, "pixel_max": 16},
    )


def _data(n=50):
    rng = np.random.default_rng(0)
    return ClassificationData(
        keys=[f"k{i}" for i in range(n)],
        labels=np.arange(n) % 10,
        images=[rng.integers(0, 17, (8, 8)).astype(np.uint8) for _ in range(n)],
        meta=META,
    )


def test_good_data_passes():
    report = validate_dataframe(profile(_data()), _suite())
    assert report.success, report.summary()


def test_bad_data_fails_with_every_breach_named():
    data = _data()
    data.labels[3] = 12  # label out of range
    data.labels[data.labels == 7] = 1  # class 7 missing
    data.images[5] = np.full((8, 8), 200, dtype=np.uint8)  # pixel out of range
    data.keys[9] = data.keys[8]  # duplicate key
    report = validate_dataframe(profile(data), _suite())
    assert not report.success
    failed = {c.expectation for c in report.failed}
    assert {
        "expect_column_values_to_be_between",
        "expect_column_distinct_values_to_contain_set",
        "expect_column_values_to_be_unique",
    } <= failed
    text = report.summary()
    assert "1 of 50 rows fail" in text and "12" in text


def test_digits_layout_loads(tmp_path):
    for path, data in digits_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    data = load_classification(tmp_path)
    assert len(data.keys) == 1797 and data.meta["pixel_max"] == 16
    assert validate_dataframe(profile(data), _suite()).success


def test_missing_image_named(tmp_path):
    (tmp_path / "classes.json").write_text('{"classes": ["a"], "height": 1, "width": 1, "pixel_max": 1}')
    (tmp_path / "labels.csv").write_text("key,label\nk1,0\n")
    with pytest.raises(ValueError, match="labels.csv:2: image k1.npy is missing"):
        load_classification(tmp_path)
