"""A JobSpec's recipe is checked against the rest of it before anything runs."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from trainyard import pipeline, recipes
from trainyard.spec import SpecError, load_spec_file, parse_spec

JOBS = Path(__file__).resolve().parents[3] / "include" / "config" / "jobs"
DETECTION = {
    "recipe": "centernet_detector",
    "dataset": {"source": "none"},
    "gates": [{"metric": "val_map", "min": 0.1}],
}
TRANSLATION = {
    "recipe": "transformer_translator",
    "dataset": {"source": "none"},
    "gates": [{"metric": "val_bleu", "min": 1}],
}


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS.glob("*.yaml")))
def test_shipped_jobs_are_valid(job):
    spec = pipeline.validate_spec(load_spec_file(str(JOBS / job)).model_dump(mode="json"))
    assert spec.recipe in recipes.RECIPES


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            {"recipe": "centernet_detector", "gates": [{"metric": "val_map", "min": 0.1}]},
            "dataset.source: 'sklearn_digits' does not fit recipe 'centernet_detector'",
        ),
        (
            {"recipe": "centernet_detector", "dataset": {"source": "synthetic_shapes"}},
            "gates[0].metric: recipe 'centernet_detector' reports no 'val_accuracy'",
        ),
        (
            {
                "recipe": "transformer_translator",
                "dataset": {"source": "synthetic_translation"},
                "gates": [{"metric": "val_bleu", "min": 1}],
                "champion": [{"metric": "val_map", "margin": 0}],
            },
            "champion[0].metric: recipe 'transformer_translator' reports no 'val_map'",
        ),
        (
            {"recipe_options": {"image_size": 64}},
            "recipe_options.image_size: not an option of recipe 'digits_cnn'; it takes none",
        ),
        (
            {**DETECTION, "recipe_options": {"image_sise": 64}},
            "recipe_options.image_sise: not an option of recipe 'centernet_detector'; it takes "
            "['coco_backend', 'image_size', 'top_k', 'width']",
        ),
        (
            {**DETECTION, "recipe_options": {"image_size": "big"}},
            "recipe_options.image_size: Input should be a valid integer (got 'big'); image_size is side of the square",
        ),
        (
            {**DETECTION, "recipe_options": {"image_size": 63}},
            "recipe_options.image_size: Input should be a multiple of 4",
        ),
        ({**DETECTION, "recipe_options": {"image_size": 2048}}, "less than or equal to 1024"),
        ({**DETECTION, "recipe_options": {"top_k": True}}, "recipe_options.top_k: Input should be a valid integer"),
        (
            {**DETECTION, "recipe_options": {"coco_backend": "mine"}},
            "recipe_options.coco_backend: Input should be 'pycocotools' or 'faster_coco_eval' (got 'mine')",
        ),
        (
            {**TRANSLATION, "recipe_options": {"d_model": 30, "nhead": 4}},
            "recipe_options: d_model (30) must be a multiple of nhead (4)",
        ),
        (
            {**TRANSLATION, "recipe_options": {"bleu_tokenize": "whitespace"}},
            "recipe_options.bleu_tokenize: must be a sacrebleu tokenizer, one of",
        ),
    ],
)
def test_mismatches_are_refused_by_name(raw, expected):
    with pytest.raises(SpecError) as err:
        pipeline.validate_spec(raw)
    assert expected in str(err.value)


def test_options_fill_defaults_and_widen_ints():
    r = recipes.get("transformer_translator")
    opts = r.opts(parse_spec({**TRANSLATION, "recipe_options": {"dropout": 0, "layers": 3}}))
    assert opts.dropout == 0.0 and isinstance(opts.dropout, float) and opts.layers == 3
    assert opts.d_model == 64 and opts.bleu_tokenize == "13a"
    with pytest.raises(ValidationError):  # frozen: options are read, never changed on the way
        opts.layers = 4  # type: ignore[misc]


def test_every_option_has_one_default_and_a_description():
    for name in recipes.RECIPES:
        for key, field in recipes.get(name).options_model.model_fields.items():
            assert field.description, f"{name}.{key}"
            assert not field.is_required(), f"{name}.{key}"


@pytest.mark.parametrize(
    "recipe, given, variant",
    [
        ("digits_cnn", {}, ""),
        ("centernet_detector", {}, "centernet_detector:64"),
        ("centernet_detector", {"image_size": 96, "top_k": 10}, "centernet_detector:96"),
        ("transformer_translator", {"d_model": 32}, "transformer_translator"),
    ],
)
def test_prepared_data_cache_keys_are_unchanged(recipe, given, variant):
    """The variant is part of the prepared-data cache key: the options models keep the keys of the option
    dicts they replaced, so caches built before stay valid."""
    r = recipes.get(recipe)
    assert r.variant(r.opts(parse_spec({"recipe": recipe, "recipe_options": given}))) == variant


def test_test_split_metrics_may_be_gated():
    raw = {
        "recipe": "transformer_translator",
        "dataset": {"source": "synthetic_translation"},
        "split": {"val_fraction": 0.2, "test_fraction": 0.1},
        "gates": [{"metric": "test_chrf", "min": 1}],
    }
    assert pipeline.validate_spec(raw).gates[0].metric == "test_chrf"


def test_unknown_recipe():
    with pytest.raises(ValueError, match="unknown recipe 'yolo'"):
        recipes.get("yolo")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"dataset": {"source": "synthetic_shapes"}}, "recipe 'custom' reads image-classification data"),
        ({"recipe_options": {"image_size": 64}}, "recipe 'custom' takes none"),
        ({"champion": [{"metric": "val_accuracy"}]}, "champion: recipe 'custom' cannot have champion rules"),
    ],
)
def test_custom_recipe_cross_checks(raw, expected):
    with pytest.raises(SpecError, match=expected):
        pipeline.validate_spec({"recipe": "custom", "custom": {"command": ["python", "train.py"]}, **raw})


def test_old_accuracy_tolerance_name_still_accepted():
    spec = pipeline.validate_spec({"export": {"accuracy_tolerance": 0.01}})
    assert spec.export.metric_tolerance == 0.01
