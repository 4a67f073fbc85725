"""A JobSpec's recipe is checked against the rest of it before anything runs."""

from pathlib import Path

import pytest

from trainyard import pipeline, recipes
from trainyard.spec import SpecError, load_spec_file

JOBS = Path(__file__).resolve().parents[3] / "include" / "config" / "jobs"


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS.glob("*.yaml")))
def test_shipped_jobs_are_valid(job):
    spec = pipeline.validate_spec(load_spec_file(str(JOBS / job)).model_dump(mode="json"))
    assert spec["recipe"] in recipes.RECIPES


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"recipe": "centernet_detector", "gates": [{"metric": "val_map", "min": 0.1}]},
         "dataset.source: 'sklearn_digits' does not fit recipe 'centernet_detector'"),
        ({"recipe": "centernet_detector", "dataset": {"source": "synthetic_shapes"}},
         "gates[0].metric: recipe 'centernet_detector' reports no 'val_accuracy'"),
        ({"recipe": "transformer_translator", "dataset": {"source": "synthetic_translation"},
          "gates": [{"metric": "val_bleu", "min": 1}], "champion": [{"metric": "val_map", "margin": 0}]},
         "champion[0].metric: recipe 'transformer_translator' reports no 'val_map'"),
        ({"recipe_options": {"image_size": 64}}, "recipe_options ['image_size'] are not options of recipe 'digits_cnn'"),
        ({"recipe": "centernet_detector", "dataset": {"source": "none"}, "gates": [{"metric": "val_map", "min": 0.1}],
          "recipe_options": {"image_size": "big"}}, "recipe_options.image_size must be a int"),
        ({"recipe": "centernet_detector", "dataset": {"source": "none"}, "gates": [{"metric": "val_map", "min": 0.1}],
          "recipe_options": {"image_size": 63}}, "multiple of 4"),
        ({"recipe": "centernet_detector", "dataset": {"source": "none"}, "gates": [{"metric": "val_map", "min": 0.1}],
          "recipe_options": {"coco_backend": "mine"}}, "coco_backend must be one of"),
        ({"recipe": "transformer_translator", "dataset": {"source": "none"}, "gates": [{"metric": "val_bleu", "min": 1}],
          "recipe_options": {"d_model": 30, "nhead": 4}}, "must be a multiple of nhead"),
        ({"recipe": "transformer_translator", "dataset": {"source": "none"}, "gates": [{"metric": "val_bleu", "min": 1}],
          "recipe_options": {"bleu_tokenize": "whitespace"}}, "must be a sacrebleu tokenizer"),
    ],
)
def test_mismatches_are_refused_by_name(raw, expected):
    with pytest.raises(SpecError) as err:
        pipeline.validate_spec(raw)
    assert expected in str(err.value)


def test_options_fill_defaults_and_widen_ints():
    r = recipes.get("transformer_translator")
    opts = r.check_options({"dropout": 0, "layers": 3})
    assert opts["dropout"] == 0.0 and isinstance(opts["dropout"], float) and opts["layers"] == 3
    assert opts["d_model"] == 64 and opts["bleu_tokenize"] == "13a"


def test_test_split_metrics_may_be_gated():
    raw = {"recipe": "transformer_translator", "dataset": {"source": "synthetic_translation"},
           "split": {"val_fraction": 0.2, "test_fraction": 0.1}, "gates": [{"metric": "test_chrf", "min": 1}]}
    assert pipeline.validate_spec(raw)["gates"][0]["metric"] == "test_chrf"


def test_unknown_recipe():
    with pytest.raises(ValueError, match="unknown recipe 'yolo'"):
        recipes.get("yolo")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"dataset": {"source": "synthetic_shapes"}}, "recipe 'custom' reads image-classification data"),
        ({"recipe_options": {"image_size": 64}}, "recipe 'custom' takes none"),
    ],
)
def test_custom_recipe_cross_checks(raw, expected):
    with pytest.raises(SpecError, match=expected):
        pipeline.validate_spec({"recipe": "custom", "custom": {"command": ["python", "train.py"]}, **raw})


def test_old_accuracy_tolerance_name_still_accepted():
    spec = pipeline.validate_spec({"export": {"accuracy_tolerance": 0.01}})
    assert spec["export"]["metric_tolerance"] == 0.01
