"""The sweep section: a bad search space is refused at the first task, naming the field."""

import pytest

from trainyard.spec import SpecError, parse_spec


def sweep(*parameters, **fields) -> dict:
    return {"sweep": {"name": "s", "parameters": list(parameters), **fields}, "resources": {"gpus_per_node": 1}}


LR = {"name": "hyperparameters.learning_rate", "type": "float", "low": 1e-4, "high": 0.5, "log": True}
CHOICE = {"name": "hyperparameters.batch_size", "type": "categorical", "choices": [16, 32]}
WIDE = [
    {"name": f"hyperparameters.{name}", "type": "categorical", "choices": list(range(1, 11))}
    for name in ("epochs", "batch_size", "seed", "momentum", "weight_decay")
]


@pytest.mark.parametrize(
    "raw, says",
    [
        (sweep({**LR, "low": 0.5}), "sweep.parameters.0: sweep parameter hyperparameters.learning_rate: empty range"),
        (sweep({**LR, "low": 0.0}), "a log scale needs low > 0 (got 0.0)"),
        (sweep({**LR, "name": "hyperparameters.lr"}), "hyperparameters has no 'lr'"),
        (sweep({**LR, "name": "resources.gpus_per_node"}), "sweep.parameters.0.name: String should match pattern"),
        (sweep({"name": "hyperparameters.optimizer", "type": "categorical"}), "a categorical parameter needs choices"),
        (sweep({**LR, "type": "int", "low": 1.5, "high": 4}), "an int parameter needs whole low, high and step"),
        (sweep(LR, sampler="grid"), "every parameter must be categorical"),
        (sweep(LR, LR), "one entry per parameter; repeated: ['hyperparameters.learning_rate']"),
        (sweep(), "sweep.parameters: Tuple should have at least 1 item"),
        (sweep(LR, warm_start_from="s"), "a sweep resumes its own study by its name"),
        (sweep(LR, trials=0), "sweep.trials: Input should be greater than or equal to 1"),
        (sweep(LR, seed=2**32), "sweep.seed: Input should be less than or equal to 4294967295"),
        (sweep({**CHOICE, "choices": [1, True]}), "repeated choices [1, True]"),  # one value to Optuna
        (sweep(*WIDE, sampler="grid"), "sweep.sampler grid: 100000 points, more than 10000"),
    ],
)
def test_a_bad_search_space_names_its_field(raw, says):
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert says in str(err.value)


@pytest.mark.parametrize(
    "raw, says",
    [
        (sweep({**LR, "high": 20.0}), "sweep.parameters[0] (hyperparameters.learning_rate = 20.0): "),
        (sweep({"name": "recipe_options.nope", "type": "int", "low": 1, "high": 4}), "not an option of recipe"),
        ({**sweep(LR, objective="step"), "recipe": "custom", "custom": {"command": ["true"]}}, "'step' numbers"),
        (sweep(LR, objective="val_bleu"), "sweep.objective: recipe 'digits_cnn' reports no 'val_bleu'"),
        (sweep(LR, constraints=[{"metric": "latency", "max": 1}]), "sweep.constraints[0].metric: a trial's result"),
        (sweep(LR, parallelism=3), "sweep.parallelism: 3 trials x 1 GPU(s) need 3 cpu slots at once; team default"),
        (
            sweep({"name": "hyperparameters.epochs", "type": "float", "low": 1, "high": 5}),
            "sweep.parameters[0] (hyperparameters.epochs = 2.508): hyperparameters.epochs: Input should be a valid "
            "integer",
        ),
        (
            {**sweep({"name": "recipe_options.width", "type": "int", "low": 1, "high": 4}), "recipe": "custom"}
            | {"custom": {"command": ["true"]}},
            "sweep.parameters[0].name: a custom program takes no recipe_options; sweep hyperparameters.*",
        ),
        ({**sweep(LR), "backends": {"launcher": "kubernetes"}}, "the trials of a sweep train with backends.launcher"),
    ],
)
def test_what_depends_on_the_recipe_and_the_team_is_refused_by_validate_spec(trainyard_home, raw, says):
    from trainyard.pipeline import validate_spec

    with pytest.raises(SpecError) as err:
        validate_spec(raw, audit=False)
    assert says in str(err.value)


def test_a_valid_sweep_passes_and_each_trial_gets_its_values(trainyard_home):
    from trainyard.pipeline import validate_spec
    from trainyard.sweeps.study import with_values

    spec = validate_spec(
        sweep(LR, {"name": "hyperparameters.batch_size", "type": "int", "low": 8, "high": 64, "log": True}),
        audit=False,
    )
    trial = with_values(spec, {"hyperparameters.learning_rate": 0.01, "hyperparameters.batch_size": 16})
    assert (trial.hyperparameters.learning_rate, trial.hyperparameters.batch_size) == (0.01, 16)
    assert trial.hyperparameters.epochs == spec.hyperparameters.epochs
