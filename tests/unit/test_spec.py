import pytest

from trainyard.spec import JobSpec, SpecError, parse_spec


def test_defaults_are_valid():
    spec = parse_spec({})
    assert spec == JobSpec()
    assert spec.resources.total_gpus == 2


@pytest.mark.parametrize(
    "raw, field, words",
    [
        ({"hyperparameters": {"epochs": 0}}, "hyperparameters.epochs", "greater than or equal to 1"),
        ({"hyperparameters": {"learning_rate": "fast"}}, "hyperparameters.learning_rate", "valid number"),
        ({"recipe": "gpt5"}, "recipe", "must be one of"),
        ({"resources": {"gpus_per_node": 0}}, "resources.gpus_per_node", "greater than or equal to 1"),
        ({"split": {"val_fraction": 1.5}}, "split.val_fraction", "less than 1"),
        ({"epochs": 3}, "epochs", "unknown field"),
        ({"dataset": {"repo": "Bad Name!"}}, "dataset.repo", "should match pattern"),
        ({"gates": [{"metric": "val_accuracy"}]}, "gates.0", "needs min or max"),
        ({"gates": [{"metric": "a", "min": 1}, {"metric": "a", "max": 2}]}, "gates", "repeated"),
    ],
)
def test_invalid_spec_names_the_field(raw, field, words):
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    text = str(err.value)
    assert f"{field}:" in text, text
    assert words in text, text


def test_every_error_is_reported_at_once():
    with pytest.raises(SpecError) as err:
        parse_spec({"hyperparameters": {"epochs": 0, "batch_size": -1}})
    assert "hyperparameters.epochs" in str(err.value) and "hyperparameters.batch_size" in str(err.value)


def test_not_a_mapping():
    with pytest.raises(SpecError, match="expected a mapping"):
        parse_spec(["a"])
