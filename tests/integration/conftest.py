import pytest

SMALL = {
    "hyperparameters": {"epochs": 4, "batch_size": 32, "learning_rate": 0.1, "seed": 3},
    "gates": [{"metric": "val_accuracy", "min": 0.85}],
}


@pytest.fixture
def small_spec():
    return {k: (v.copy() if isinstance(v, dict) else list(v)) for k, v in SMALL.items()}
