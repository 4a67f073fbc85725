"""The background tracker: real MLflow (SQLite) and TensorBoard files, written off the training thread."""

import pytest
import torch

from trainyard.spec import JobSpec
from trainyard.training.run_config import RunConfig
from trainyard.training.tracking import Tracker, TrackingError


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(root / "artifacts"))
    return uri, client, client.create_run(exp).info.run_id


def _cfg(tmp_path, **kw) -> RunConfig:
    return RunConfig(spec=JobSpec(), data={}, out_dir=str(tmp_path), **kw)


def test_windows_of_tensors_reach_mlflow_and_tensorboard(tmp_path, mlflow_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    uri, client, run_id = mlflow_run
    tracker = Tracker(_cfg(tmp_path, tracking_uri=uri, mlflow_run_id=run_id, tensorboard_dir=str(tmp_path / "tb")))
    for start in range(0, 30, 10):
        steps = list(range(start + 1, start + 11))
        tracker.log(steps, {"train_loss": torch.tensor([float(s) for s in steps]), "train_lr": [0.1] * 10})
    tracker.log([30], {"val_accuracy": 0.5, "epoch": 1})
    tracker.close()
    history = client.get_metric_history(run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(1, 31)]
    assert [m.value for m in client.get_metric_history(run_id, "val_accuracy")] == [0.5]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 31))


def test_a_full_queue_drops_instead_of_blocking_the_step(tmp_path, monkeypatch):
    """The writer is stuck (a tracking server that hangs): log() still returns, and the loss is counted."""
    import threading

    from trainyard.training import tracking

    monkeypatch.setattr(tracking, "QUEUE_ITEMS", 3)
    release = threading.Event()
    stuck_run = tracking.Tracker._run
    monkeypatch.setattr(tracking.Tracker, "_run", lambda self: (release.wait(), stuck_run(self)))
    tracker = Tracker(_cfg(tmp_path, tensorboard_dir=str(tmp_path / "tb")))
    for step in range(1, 11):
        tracker.log([step], {"train_loss": 1.0})  # would hang here if log() waited for room
    assert tracker.dropped == 7
    release.set()
    tracker.close()


def test_a_writer_error_is_raised_by_close(tmp_path, mlflow_run, capsys):
    uri, _, _ = mlflow_run
    tracker = Tracker(_cfg(tmp_path, tracking_uri=uri, mlflow_run_id="no-such-run"))
    tracker.log([1], {"train_loss": 1.0})
    with pytest.raises(TrackingError, match="metrics were lost"):
        tracker.close()
    assert "tracking failed" in capsys.readouterr().out


def test_nothing_to_track_starts_no_thread(tmp_path):
    tracker = Tracker(_cfg(tmp_path))
    tracker.log([1], {"train_loss": 1.0})
    tracker.close()
    assert not tracker._thread.is_alive() and not tracker.enabled
