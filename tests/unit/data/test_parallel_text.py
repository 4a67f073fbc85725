import json

import pytest

from trainyard.data.parallel_text import load_pairs, profile_pairs, validate_parallel_text

GOOD = [
    ("p1", "the cat sat", "le chat était assis"),
    ("p2", "hello", "bonjour"),
    ("p3", "good morning everyone", "bonjour à tous"),
    ("p4", "thank you very much", "merci beaucoup"),
]


def failures(report):
    return {(c.expectation, c.kwargs.get("column")): c.unexpected_count for c in report.failed}


def write_tsv(root, rows):
    lines = ["key\tsource\ttarget"] + ["\t".join(r) for r in rows]
    (root / "pairs.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_jsonl(root, rows):
    lines = [json.dumps({"key": k, "source": s, "target": t}, ensure_ascii=False) for k, s, t in rows]
    (root / "pairs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("write", [write_tsv, write_jsonl])
def test_good_pairs_pass_in_both_formats(tmp_path, write):
    write(tmp_path, GOOD)
    pairs = load_pairs(tmp_path)
    assert [p.target for p in pairs][0] == "le chat était assis"  # UTF-8 read as such
    df = profile_pairs(pairs)
    assert df["source_len"].tolist() == [3, 1, 3, 4] and df["target_len"].tolist() == [4, 1, 3, 2]
    assert df["length_ratio"].tolist() == [4 / 3, 1.0, 1.0, 0.5]
    report = validate_parallel_text(tmp_path)
    assert report.success, report.summary()


@pytest.mark.parametrize("write", [write_tsv, write_jsonl])
def test_corrupted_pairs_fail_with_each_breach_named(tmp_path, write):
    bad = GOOD + [
        ("p5", "a sentence with a target missing", ""),  # empty target
        ("p6", "one", "one two three four five six seven eight nine ten"),  # 10x longer
        ("p2", "hello again", "rebonjour"),  # duplicate key
    ]
    write(tmp_path, bad)
    report = validate_parallel_text(tmp_path)
    assert not report.success
    assert failures(report) == {
        ("expect_column_values_to_be_in_set", "target_empty"): 1,
        ("expect_column_values_to_be_between", "length_ratio"): 1,
        ("expect_column_values_to_be_unique", "key"): 2,  # GX counts every row of a duplicated key
    }
    assert "10.0" in report.summary()


def test_ratio_bounds_are_parameters(tmp_path):
    write_tsv(tmp_path, GOOD)
    report = validate_parallel_text(tmp_path, min_ratio=0.9, max_ratio=1.1)
    assert failures(report) == {("expect_column_values_to_be_between", "length_ratio"): 2}


def test_malformed_files_named(tmp_path):
    (tmp_path / "pairs.tsv").write_text("key\tsource\ttarget\np1\tonly source\n")
    with pytest.raises(ValueError, match=r"pairs\.tsv:2: expected 3 tab-separated fields, got 2"):
        load_pairs(tmp_path)
    (tmp_path / "pairs.tsv").write_text("id\tsrc\ttgt\n")
    with pytest.raises(ValueError, match="header must be"):
        load_pairs(tmp_path)
    (tmp_path / "pairs.tsv").unlink()
    (tmp_path / "pairs.jsonl").write_text('{"key": "a", "source": "x", "target": "y"}\n{"key": "b", "source": "x"}\n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl:2: expected an object with keys"):
        load_pairs(tmp_path)
    write_tsv(tmp_path, GOOD)
    with pytest.raises(ValueError, match="exactly one of"):
        load_pairs(tmp_path)
