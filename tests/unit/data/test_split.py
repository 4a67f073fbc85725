from trainyard.data.split import split_keys


def test_split_is_deterministic_and_near_the_fraction():
    keys = [f"k{i}" for i in range(5000)]
    a = split_keys(keys, 0.2, seed=7)
    assert a == split_keys(keys, 0.2, seed=7)
    assert 0.17 < len(a["val"]) / len(keys) < 0.23
    assert not set(a["train"]) & set(a["val"])


def test_appending_data_never_moves_a_sample():
    """A sample's split is its own: the split of the grown dataset puts every old key where the split
    of the old one did, and the new keys land on both sides."""
    old = [f"k{i}" for i in range(1000)]
    new = [f"n{i}" for i in range(500)]
    before, after = split_keys(old, 0.25, 1), split_keys(old + new, 0.25, 1)
    for split in ("train", "val"):
        assert set(before[split]) == set(after[split]) & set(old), split
        assert set(after[split]) & set(new), f"no new key went to {split}"
    assert set(split_keys(old[::-1], 0.25, 1)["val"]) == set(before["val"])  # nor does the order matter


def test_seed_changes_the_assignment():
    keys = [f"k{i}" for i in range(200)]
    assert split_keys(keys, 0.5, 0) != split_keys(keys, 0.5, 1)
