import json

import pytest

from trainyard.data import formats
from trainyard.data.prepare import LeakageError, check_leakage
from trainyard.recipes.digits import prepare_classification


def test_three_way_split_is_cached_and_disjoint(digits_dir, tmp_path):
    m = prepare_classification(digits_dir, "c" * 64, tmp_path, 0.15, 3, test_fraction=0.15)
    assert m.cached is False and set(m.counts) == {"train", "val", "test"}
    assert sum(m.counts.values()) == 1797
    keys = {s: set(formats.read("lmdb", m.split(s))[0]) for s in ("train", "val", "test")}
    assert not (keys["train"] & keys["val"] or keys["train"] & keys["test"] or keys["val"] & keys["test"])
    again = prepare_classification(digits_dir, "c" * 64, tmp_path, 0.15, 3, test_fraction=0.15)
    assert again.cached is True and again.counts == m.counts
    # Other settings, other cache entry.
    other = prepare_classification(digits_dir, "c" * 64, tmp_path, 0.2, 3)
    assert other.path != m.path and other.test is None
    assert json.loads((tmp_path / other.path.split("/")[-1] / "manifest.json").read_text())["val_fraction"] == 0.2


def test_leakage_is_caught():
    check_leakage({"train": ["a", "b"], "val": ["c"]})
    with pytest.raises(LeakageError, match="expect_column_values_to_be_unique"):
        check_leakage({"train": ["a", "b"], "val": ["b"]})
