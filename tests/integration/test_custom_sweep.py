"""A sweep over a custom program (``recipe: custom``), through the real local launcher and sandbox: each
trial's program gets its values in TRAINYARD_HYPERPARAMETERS, reports the objective in its metrics file,
and the pruner's answer reaches it through the verdict file. A program that obeys exits by itself; one
that never looks is stopped by the platform. Either way the trial is PRUNED in the study, its MLflow run
KILLED and its checkpoints gone; the best trial's ONNX model goes on to export."""

import os
import sys
from pathlib import Path

import optuna
import pytest
from dag_helpers import grid_order

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "fixtures" / "custom_sweep_train.py"
GOOD_LR, BAD_LR = 0.5, 1e-5  # ~0.9 val accuracy after an epoch of 20 steps, against ~0.1
# the grid's order with this seed (grid_order): the good value first, so the pruner has a finished trial to
# hold the second one against after its first epoch (the median pruner's first trial is never stopped)
SEED = 5


def _sweep_spec(name: str, *args: str):
    from trainyard import pipeline

    return pipeline.validate_spec(
        {
            "name": f"byo-{name}",
            "recipe": "custom",
            "custom": {"command": [sys.executable, str(PROGRAM), *args]},
            "hyperparameters": {"epochs": 3, "seed": 1},
            "resources": {"gpus_per_node": 1},
            "sweep": {
                "name": name,
                "parameters": [
                    {"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [GOOD_LR, BAD_LR]}
                ],
                "sampler": "grid",
                "seed": SEED,
                "trials": 2,
                "parallelism": 1,
                "startup_trials": 1,
                "warmup_epochs": 1,
                "objective": "val_accuracy",
            },
        },
        audit=False,
    )


def _sweep(spec, run: str):
    from trainyard import pipeline

    dataset = pipeline.resolve_dataset(spec)
    data = pipeline.prepare_data(spec, dataset)
    assert grid_order([GOOD_LR, BAD_LR], SEED, 2) == [GOOD_LR, BAD_LR]  # the premise of the pruning
    assert pipeline.plan_sweep(spec) == [0, 1]
    trials = [pipeline.train_trial(spec, dataset, data, run, slot) for slot in (0, 1)]
    return dataset, data, trials


def _check_pruned(trials, study_spec):
    from trainyard.sweeps.study import open_study
    from trainyard.tracking import mlflow_tracking as mt

    complete, pruned = trials
    assert complete["state"] == "complete" and complete["params"] == {"hyperparameters.learning_rate": GOOD_LR}
    assert pruned["state"] == "pruned" and pruned["params"] == {"hyperparameters.learning_rate": BAD_LR}
    study = open_study(study_spec)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert list(study.trials[1].intermediate_values) == [1]  # stopped at its first reporting point
    c = mt.client()
    assert c.get_run(pruned["mlflow_run_id"]).info.status == "KILLED"
    runs = Path(os.environ["TRAINYARD_HOME"]) / "runs" / study_spec.name
    (kept,) = runs.glob("*trial-0/work/checkpoints")  # a finished trial's checkpoints stay, a pruned one's go
    assert sorted(p.name for p in kept.iterdir()) == ["epoch-1.pt", "epoch-2.pt", "epoch-3.pt"]
    assert not list(runs.glob("*trial-1/work/checkpoints")) and list(runs.glob("*trial-1/work"))
    assert not list(runs.glob("*trial-1/work/model.onnx"))  # it did not train on to the end
    # the program trained with each trial's own value: it reported the learning rate it read
    assert [m.value for m in c.get_metric_history(complete["mlflow_run_id"], "lr")] == [GOOD_LR] * 3
    assert {m.value for m in c.get_metric_history(pruned["mlflow_run_id"], "lr")} == {BAD_LR}
    return study


def test_a_custom_programs_sweep_prunes_a_loser_it_is_told_about_and_exports_the_best(trainyard_home):
    from trainyard import pipeline

    spec = _sweep_spec("obeys")
    dataset, data, trials = _sweep(spec, "train_pipeline/manual__obeys")
    study = _check_pruned(trials, spec)
    assert study.trials[0].value > 0.8 > study.trials[1].intermediate_values[1]
    best = pipeline.close_sweep(spec, dataset, "train_pipeline/manual__obeys")
    assert best["trial"] == 0 and best["value"] == study.trials[0].value
    trained = best["trained"]
    assert trained.final_metrics["val_accuracy"] == best["value"] and Path(trained.onnx_path).is_file()
    # as the DAG's later steps read it: the trial again, from the study, by its number
    trial_spec, held = pipeline.trained_job(spec, "train_pipeline/manual__obeys", trained.model_dump(mode="json"))
    assert trial_spec.hyperparameters.learning_rate == GOOD_LR and trial_spec.sweep is None and held == trained
    assert pipeline.evaluate(trial_spec, held, data)["val_accuracy"] == best["value"]
    exported = pipeline.export_onnx(trial_spec, held, data)
    assert Path(exported.onnx_path).is_file()


def test_a_custom_program_deaf_to_the_pruner_is_stopped_and_its_trial_pruned(trainyard_home, monkeypatch):
    from trainyard.sweeps import trials as trials_module

    monkeypatch.setattr(trials_module, "GRACE_S", 3.0)
    spec = _sweep_spec("deaf", "--ignore-verdict")
    _, _, trials = _sweep(spec, "train_pipeline/manual__deaf")
    _check_pruned(trials, spec)
