from trainyard.data.split import assign, split_keys


def test_split_is_deterministic_and_near_the_fraction():
    keys = [f"k{i}" for i in range(5000)]
    a = split_keys(keys, 0.2, seed=7)
    assert a == split_keys(keys, 0.2, seed=7)
    assert 0.17 < len(a["val"]) / len(keys) < 0.23
    assert not set(a["train"]) & set(a["val"])


def test_appending_data_never_moves_a_sample():
    old = [f"k{i}" for i in range(1000)]
    new = old + [f"n{i}" for i in range(500)]
    before = {k: assign(k, 0.25, 1) for k in old}
    after = split_keys(new, 0.25, 1)
    for split, keys in after.items():
        for k in keys:
            if k in before:
                assert before[k] == split


def test_seed_changes_the_assignment():
    keys = [f"k{i}" for i in range(200)]
    assert split_keys(keys, 0.5, 0) != split_keys(keys, 0.5, 1)
