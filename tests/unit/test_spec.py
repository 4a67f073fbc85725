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
        ({"resources": {"nodes": 2, "min_nodes": 3}}, "resources", "min_nodes (3) must be at most nodes (2)"),
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


def test_spec_errors_are_permanent_and_still_value_errors():
    from trainyard.errors import PermanentError, spec_error_message

    with pytest.raises(SpecError) as err:
        parse_spec({"hyperparameters": {"epochs": 0}})
    assert isinstance(err.value, PermanentError) and isinstance(err.value, ValueError)
    assert str(err.value) == spec_error_message(
        ["hyperparameters.epochs: Input should be greater than or equal to 1 (got 0)"]
    )


def _models(model, seen=None):
    """The JobSpec's model and every model nested in it."""
    from pydantic import BaseModel

    seen = seen if seen is not None else []
    if model not in seen:
        seen.append(model)
        for field in model.model_fields.values():
            for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
                for inner in [arg, *getattr(arg, "__args__", ())]:
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        _models(inner, seen)
    return seen


@pytest.mark.parametrize("model", _models(JobSpec), ids=lambda m: m.__name__)
def test_every_field_is_described_once(model):
    """A section (a nested model) is described by its docstring, a plain field by its own description:
    the form and the docs are generated from these, so a missing one shows as a blank."""
    from pydantic import BaseModel

    assert model.__doc__ and model.__doc__.strip(), model.__name__
    for name, field in model.model_fields.items():
        kinds = [field.annotation, *getattr(field.annotation, "__args__", ())]  # X or X | None
        nested = any(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds)
        assert nested or field.description, f"{model.__name__}.{name} has no description"


def test_one_checkpoint_interval():
    with pytest.raises(SpecError, match="every_steps or every_minutes, not both"):
        parse_spec({"checkpointing": {"every_steps": 10, "every_minutes": 5}})
    assert parse_spec({"checkpointing": {"every_minutes": 5}}).checkpointing.every_steps is None


@pytest.mark.parametrize("first", ["--nproc_per_node=64", "-m", ""])
def test_custom_command_starts_with_the_program_not_an_option(first):
    with pytest.raises(SpecError, match=r"custom\.command.*program to run"):
        parse_spec({"recipe": "custom", "custom": {"command": [first, "train.py"]}})


def test_a_run_is_listed_by_its_job_s_name_recipe_gpus_and_team():
    spec = parse_spec(
        {
            "name": "pets",
            "resources": {"team": "vision", "gpu_type": "a100", "nodes": 2, "gpus_per_node": 4},
            "backends": {"launcher": "kubernetes"},
        }
    )
    assert spec.headline() == "pets: digits_cnn on 8 x a100, team vision"
    sweep = {
        "name": "lr",
        "trials": 6,
        "parameters": [{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.01, "high": 0.1}],
    }
    assert parse_spec({"sweep": sweep}).headline() == "digits: digits_cnn on 2 x cpu, team default, sweep of 6 trials"
    assert parse_spec({"replay_of": "digits:3"}).headline().endswith(", replay of digits:3")


@pytest.mark.parametrize(
    "other",
    [{"distributed": {"strategy": "deepspeed"}}, {"distributed": {"strategy": "horovod"}},
     {"recipe": "custom", "custom": {"command": ["python", "train.py"]}}],
)  # fmt: skip
def test_only_a_built_in_ddp_training_goes_on_with_fewer_nodes(other):
    elastic = {"resources": {"nodes": 4, "min_nodes": 2}, "backends": {"launcher": "kubernetes"}}
    assert parse_spec(elastic).resources.elastic
    with pytest.raises(SpecError, match="min_nodes below resources.nodes .elastic. needs a built-in recipe"):
        parse_spec({**elastic, **other})
    with pytest.raises(SpecError, match="needs distributed.max_restarts of 1 or more"):
        parse_spec({**elastic, "distributed": {"max_restarts": 0}})
    assert not parse_spec(
        {**other, "resources": {"nodes": 4, "min_nodes": 4}, "backends": {"launcher": "kubernetes"}}
    ).resources.elastic


@pytest.mark.parametrize(
    "other",
    [{"distributed": {"strategy": "horovod"}}, {"recipe": "custom", "custom": {"command": ["python", "train.py"]}},
     {"sweep": {"name": "lr", "trials": 2,
                "parameters": [{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.01, "high": 0.1}]}}],
)  # fmt: skip
def test_a_local_job_of_several_nodes_is_a_built_in_ddp_or_deepspeed_training(other):
    nodes = {"resources": {"nodes": 2, "gpus_per_node": 1}}
    assert parse_spec(nodes).resources.nodes == 2
    assert parse_spec({**nodes, "distributed": {"strategy": "deepspeed"}}).resources.total_gpus == 2
    with pytest.raises(SpecError, match="needs backends.launcher 'kubernetes'"):
        parse_spec({**nodes, **other})
    assert parse_spec({**nodes, **other, "backends": {"launcher": "kubernetes"}}).resources.nodes == 2
