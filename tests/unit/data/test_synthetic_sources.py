"""The built-in synthetic datasets: deterministic, in the real layouts, and passing their own suites."""

import json

import numpy as np
import pytest

from datafiles import write_files
from trainyard.data import shapes, synthetic_text
from trainyard.data.detection import validate_detection
from trainyard.data.parallel_text import load_pairs, validate_parallel_text


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("shapes"), shapes.generate(40, seed=3))


def test_shapes_are_deterministic_coco_and_valid(shapes_dir):
    assert shapes.generate(40, seed=3) == shapes.generate(40, seed=3)
    assert shapes.generate(40, seed=3) != shapes.generate(40, seed=4)
    coco = json.loads((shapes_dir / "annotations.json").read_text())
    assert len(coco["images"]) == 40 and [c["name"] for c in coco["categories"]] == list(shapes.CATEGORIES)
    assert 40 <= len(coco["annotations"]) <= 120
    report = validate_detection(shapes_dir)
    assert report.success, report.summary()


def test_shape_boxes_are_the_drawn_pixels(shapes_dir):
    """Each box is exactly the extent of a bright shape: the pixels just inside the box edges are painted
    (colours >= 120) and the box is no bigger than the shape allows."""
    from PIL import Image

    coco = json.loads((shapes_dir / "annotations.json").read_text())
    files = {img["id"]: img["file_name"] for img in coco["images"]}
    for ann in coco["annotations"][:30]:
        x, y, w, h = (int(v) for v in ann["bbox"])
        img = np.asarray(Image.open(shapes_dir / "images" / files[ann["image_id"]]))
        bright = img[y : y + h, x : x + w].max(axis=2) >= 120
        # every row and every column of the box holds some of the shape
        assert bright.any(axis=1).all() and bright.any(axis=0).all()
        assert 10 <= max(w, h) <= 26


def test_shapes_refuse_impossible_sizes():
    with pytest.raises(ValueError, match="min_side <= max_side <= size"):
        shapes.generate(1, size=16, min_side=10, max_side=30)


def test_translation_pairs_follow_the_rules(tmp_path):
    files = synthetic_text.generate(300, seed=0)
    assert files == synthetic_text.generate(300, seed=0)
    pairs = load_pairs(write_files(tmp_path, files))
    assert len(pairs) == 300 and len({p.key for p in pairs}) == 300
    lex = synthetic_text.lexicon(0)
    assert len(set(lex.values())) == len(lex)  # an invertible word mapping
    for p in pairs:
        src, tgt = p.source.split(), p.target.split()
        verb = next(w for w in src if w in synthetic_text.VERBS)
        # subject-object-verb: the verb's translation follows both noun phrases
        adverb = src[-1] in synthetic_text.ADVERBS
        assert tgt[-2 if adverb else -1] == lex[verb]
        # a plural noun ("dogs") comes out as noun + the particle "ri"
        assert src.count("the") >= sum(w.endswith("s") and w[:-1] in synthetic_text.NOUNS for w in src)
        assert tgt.count(synthetic_text.PLURAL) == sum(w[:-1] in synthetic_text.NOUNS and w.endswith("s") for w in src)
    assert validate_parallel_text(tmp_path).success


def test_noun_phrase_order():
    lex = synthetic_text.lexicon(0)
    assert synthetic_text._target_np(lex, "the", ["big", "red"], "dog", False) == [
        lex["dog"],
        lex["red"],
        lex["big"],
        lex["the"],
    ]
    assert synthetic_text._target_np(lex, "the", [], "cat", True) == [lex["cat"], "ri", lex["the"]]


def test_docstring_example_holds():
    lex = synthetic_text.lexicon(0)
    tgt = (
        synthetic_text._target_np(lex, "the", ["big", "red"], "dog", False)
        + synthetic_text._target_np(lex, "a", [], "cat", False)
        + [lex["sees"]]
    )
    assert " ".join(tgt) == "levego bosufa pusoni pigeba balulo furu nulu"
    assert "levego bosufa pusoni pigeba balulo furu nulu" in synthetic_text.__doc__
