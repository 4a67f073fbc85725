"""A sweep's trial is launched as its task's admission says (pipeline.sweep.train_trial): the lease's devices,
its wait and the run's tags reach the trial's training, the lease's lost signal reaches run_trial, and the
workers are stopped by the trial's own watcher."""

import threading
from types import SimpleNamespace

from trainyard.pipeline import sweep
from trainyard.pipeline.records import PinnedDataset
from trainyard.pipeline.train import LocalLaunch
from trainyard.spec import parse_spec

SPEC = parse_spec(
    {
        "name": "digits",
        "sweep": {
            "name": "lr",
            "trials": 2,
            "parameters": [{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.01, "high": 0.1}],
        },
    }
)
DATASET = PinnedDataset(store="local", repo="digits", ref="main", commit="c" * 64, digest="d" * 64, files=3)


def test_a_trial_trains_on_its_leases_devices_with_its_runs_tags_stopped_by_its_watcher(monkeypatch):
    seen: dict = {}

    def run_trial(spec, sweep_run, slot, launch, lost=None, of_lineage=""):
        seen["run_trial"] = {"sweep_run": sweep_run, "slot": slot, "lost": lost}
        watcher = SimpleNamespace(halt=threading.Event(), settle=lambda: False)
        seen["watcher"] = watcher
        return launch(spec, f"{sweep_run}#trial-0", {"sweep.trial": "0"}, watcher)

    def train(spec, dataset, data, run_key, local, trial_objective=None, pruned=None):
        seen["train"] = {"run_key": run_key, "local": local, "objective": trial_objective, "pruned": pruned}
        return {"trained": True}

    monkeypatch.setattr("trainyard.sweeps.trials.run_trial", run_trial)
    monkeypatch.setattr(sweep, "train", train)
    lost, lines = threading.Event(), []
    lease = LocalLaunch(on_line=lines.append, devices=["2", "3"], stop=lost, waited_s=3.0, tags={"team": "vision"})

    assert sweep.train_trial(SPEC, DATASET, {}, "train_pipeline/r1", 4, lease) == {"trained": True}
    assert seen["run_trial"] == {"sweep_run": "train_pipeline/r1", "slot": 4, "lost": lost}
    local = seen["train"]["local"]
    assert local.stop is seen["watcher"].halt and local.stop is not lost  # the watcher stops the workers
    assert (local.on_line, local.devices, local.waited_s) == (lines.append, ["2", "3"], 3.0)
    assert dict(local.tags) == {"team": "vision", "sweep.trial": "0"} and dict(lease.tags) == {"team": "vision"}
    assert seen["train"]["objective"] == SPEC.sweep.objective and seen["train"]["pruned"] is seen["watcher"].settle
