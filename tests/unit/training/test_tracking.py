"""The background tracker: real MLflow (SQLite) and TensorBoard files, written off the training thread."""

import re

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
    return RunConfig(spec=JobSpec(), out_dir=str(tmp_path), **kw)


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


def test_histograms_due_while_the_thread_bins_earlier_ones_are_skipped_and_said_so(tmp_path, monkeypatch, capsys):
    """The thread is busy: the step takes no more than HISTOGRAMS_IN_FLIGHT sets of copies and counts the
    others as skipped histograms, not as lost metric points; what was taken is written."""
    import threading

    from tensorboard.backend.event_processing.event_accumulator import HISTOGRAMS, EventAccumulator

    from trainyard.spec import parse_spec
    from trainyard.training import tracking

    release = threading.Event()
    stuck_run = tracking.Tracker._run
    monkeypatch.setattr(tracking.Tracker, "_run", lambda self: (release.wait(), stuck_run(self)))
    spec = parse_spec({"tracking": {"histogram_every_steps": 1}})
    board = tmp_path / "tb"
    tracker = Tracker(RunConfig(spec=spec, out_dir=str(tmp_path), tensorboard_dir=str(board)))
    model = torch.nn.Linear(3, 2)
    for step in range(1, 6):
        tracker.histograms(step, model)
    skipped = 5 - tracking.HISTOGRAMS_IN_FLIGHT
    assert (tracker.histograms_skipped, tracker.dropped) == (skipped, 0)
    release.set()
    tracker.close()
    assert f"{skipped} of the histogram sets due were skipped" in capsys.readouterr().out
    events = EventAccumulator(str(board), size_guidance={HISTOGRAMS: 0})
    events.Reload()
    assert [e.step for e in events.Histograms("weights/weight")] == list(range(1, tracking.HISTOGRAMS_IN_FLIGHT + 1))


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


def test_the_tracker_thread_writes_at_close_without_waiting_out_its_interval(tmp_path):
    import time

    from trainyard.training.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    tracker = Tracker(_cfg(tmp_path, metrics_file=str(path)), every_s=3600)
    assert tracker.wait_ready()
    tracker.log([1], {"train_loss": torch.tensor([0.5])})
    started = time.monotonic()
    tracker.close()
    assert time.monotonic() - started < 60 and read_metrics(path) == [(1, "train_loss", 0.5)]


def test_the_tracker_thread_writes_every_interval(tmp_path):
    import time

    from trainyard.training.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    tracker = Tracker(_cfg(tmp_path, metrics_file=str(path)), every_s=0.2)
    assert tracker.wait_ready()
    tracker.log([1], {"train_loss": 1.0})  # 1 of 10,000: only the interval wakes the thread
    deadline = time.monotonic() + 60
    while not (path.exists() and read_metrics(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_metrics(path) == [(1, "train_loss", 1.0)]
    tracker.close()


def test_a_half_full_queue_wakes_the_tracker_thread_before_its_interval(tmp_path, monkeypatch):
    import time

    from trainyard.training import tracking
    from trainyard.training.metrics import read_metrics

    monkeypatch.setattr(tracking, "QUEUE_ITEMS", 4)
    path = tmp_path / "metrics.jsonl"
    tracker = Tracker(_cfg(tmp_path, metrics_file=str(path)), every_s=3600)
    assert tracker.wait_ready()
    tracker.log([1], {"train_loss": 1.0})
    tracker.log([2], {"train_loss": 0.5})  # 2 of 4: the thread wakes and writes both
    deadline = time.monotonic() + 60
    while not (path.exists() and read_metrics(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_metrics(path) == [(1, "train_loss", 1.0), (2, "train_loss", 0.5)]
    tracker.close()


# -- the metrics file: what a local worker writes instead, and the task's relay -------------------------------
def _run_dir_with_metrics(tmp_path, text: str):
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "work" / "metrics.jsonl").write_text(text)
    return tmp_path


def test_a_worker_with_a_metrics_file_writes_only_that(tmp_path, mlflow_run):
    from trainyard.training.metrics import read_metrics

    uri, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    path = tmp_path / "metrics.jsonl"
    cfg = _cfg(
        tmp_path, tracking_uri=uri, mlflow_run_id=run_id, tensorboard_dir=str(tmp_path / "tb"), metrics_file=str(path)
    )
    tracker = Tracker(cfg)
    tracker.log([1, 2], {"train_loss": torch.tensor([0.5, 0.25]), "train_lr": 0.1})
    tracker.log([2], {"val_accuracy": 0.75, "epoch": 1})
    tracker.close()
    assert read_metrics(path) == [
        (1, "train_loss", 0.5),
        (1, "train_lr", 0.1),
        (2, "train_loss", 0.25),
        (2, "train_lr", 0.1),
        (2, "val_accuracy", 0.75),
        (2, "epoch", 1.0),
    ]
    assert client.get_metric_history(run_id, "train_loss") == []  # nothing of its own to MLflow
    assert not (tmp_path / "tb").exists()


def test_the_relay_logs_each_complete_line_once(tmp_path, mlflow_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    written = '{"step": 1, "train_loss": 2.0}\n{"step": 2, "train_loss": 1.5}\n{"step": 3, "tra'
    run_dir = _run_dir_with_metrics(tmp_path, written)
    tb = str(tmp_path / "tb")
    assert metrics.relay(run_dir, client, run_id, tb) == 2  # the line still being written waits
    with open(run_dir / "work" / "metrics.jsonl", "a") as fh:
        fh.write('in_loss": 1.0, "train_lr": NaN}\n')
    assert metrics.relay(run_dir, client, run_id, tb) == 2
    assert metrics.relay(run_dir, client, run_id, tb) == 0  # nothing twice
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    assert history == [(1, 2.0), (2, 1.5), (3, 1.0)]
    events = EventAccumulator(tb)
    events.Reload()
    # each relay call writes an event file of its own; files made in the same second are read in the order
    # of the rest of their names, so the steps are compared as a set of each step once
    assert sorted(e.step for e in events.Scalars("train/loss")) == [1, 2, 3]


def test_the_live_relay_and_its_tensorboard_writer_run_at_its_nice_value(tmp_path, mlflow_run):
    import os
    import threading

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 1, "train_loss": 2.0}\n')
    tb = str(tmp_path / "tb")
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with metrics.LiveRelay(run_dir, client, run_id, tb, on_line=print, every_s=3600) as relay:
        events_writer = relay._writer._get_file_writer().event_writer  # tensorboard's EventFileWriter
        threads = {"relay": relay._thread, "writer": events_writer._async_writer._worker}
        nice = {name: os.getpriority(os.PRIO_PROCESS, t.native_id) for name, t in threads.items()}
    assert nice == {"relay": max(base, metrics.RELAY_NICE), "writer": max(base, metrics.RELAY_NICE)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller's thread untouched
    # the pass on leaving relays what the workers wrote
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(1, 2.0)]
    events = EventAccumulator(tb)
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1]


def test_an_interrupted_start_of_the_live_relay_leaves_no_thread_and_relays_nothing(tmp_path, mlflow_run):
    """The task is killed while the relay starts: entering raises, and no pass (MLflow may not answer) runs."""
    import threading

    from trainyard.training import metrics

    class Interrupted(threading.Event):
        def wait(self, timeout=None):
            super().wait(timeout)  # the thread has its writer, and would go on to relay
            raise KeyboardInterrupt

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 1, "train_loss": 2.0}\n')
    relay = metrics.LiveRelay(run_dir, client, run_id, str(tmp_path / "tb"), print, every_s=3600)
    relay._started = Interrupted()
    with pytest.raises(KeyboardInterrupt), relay:
        pytest.fail("entered an interrupted relay")
    assert not relay._thread.is_alive()
    assert client.get_metric_history(run_id, "train_loss") == []


def test_a_tensorboard_folder_that_cannot_be_made_fails_the_live_relay_on_entering(tmp_path, mlflow_run):
    from trainyard.training import metrics

    _, client, run_id = mlflow_run
    (tmp_path / "a-file").write_text("")
    tb = str(tmp_path / "a-file" / "tb")
    relay = metrics.LiveRelay(_run_dir_with_metrics(tmp_path, ""), client, run_id, tb, print)
    with pytest.raises(OSError), relay:
        pytest.fail("entered a relay whose TensorBoard writer could not be made")
    assert not relay._thread.is_alive()


def test_the_relay_reads_a_large_file_in_pieces(tmp_path, mlflow_run, monkeypatch):
    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    monkeypatch.setattr(metrics, "READ_LIMIT", 64)
    run_dir = _run_dir_with_metrics(tmp_path, "".join(f'{{"step": {s}, "loss": {s}}}\n' for s in range(1, 41)))
    assert metrics.relay(run_dir, client, run_id) == 40
    assert len(client.get_metric_history(run_id, "loss")) == 40


def test_a_malformed_line_stops_the_relay_naming_it_and_keeps_what_came_before(tmp_path, mlflow_run):
    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 1, "loss": 1}\n\n{"loss": 2}\n{"step": 3, "loss": 3}\n')
    for _ in range(2):  # the collect step's pass fails the same way as the live relay's
        with pytest.raises(ValueError, match=r"metrics.jsonl:3: expected a JSON object with an integer 'step'"):
            metrics.relay(run_dir, client, run_id)
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [1.0]


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_the_relay_reads_the_workers_own_file_never_what_it_points_at(tmp_path, mlflow_run, kind):
    """A sandboxed command links its metrics file to a secret it cannot read: the relay, which can, refuses."""
    import os

    from trainyard.training import metrics

    _, client, run_id = mlflow_run
    secret = tmp_path / "signing.pem"
    secret.write_text('{"step": 1, "stolen": 1}\n')
    (tmp_path / "run" / "work").mkdir(parents=True)
    path = tmp_path / "run" / "work" / "metrics.jsonl"
    if kind == "symlink":
        path.symlink_to(secret)
    elif kind == "hardlink":
        os.link(secret, path)
    else:
        os.mkfifo(path)
    with pytest.raises(ValueError, match="not a regular file of its own"):
        metrics.relay(tmp_path / "run", client, run_id)
    with pytest.raises(ValueError, match="not a regular file of its own"):
        metrics.read_metrics(path)


def test_a_half_written_line_of_a_killed_try_is_cut_before_the_next_try_appends(tmp_path):
    from trainyard.training.metrics import open_for_append, read_metrics

    path = tmp_path / "work" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')  # SIGKILLed mid-write
    with open_for_append(path) as fh:
        fh.write('{"step": 2, "loss": 0.5}\n')
    assert read_metrics(path) == [(1, "loss", 1.0), (2, "loss", 0.5)]
    with open_for_append(tmp_path / "new" / "metrics.jsonl") as fh:  # the directory is made
        fh.write('{"step": 1, "loss": 1.0}\n')


def test_a_metrics_file_rewritten_from_its_start_is_relayed_again_from_its_start(tmp_path, mlflow_run):
    """A custom program that reopens its file with "w" after a restart: nothing is skipped or misparsed."""
    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 1, "loss": 1}\n{"step": 2, "loss": 2}\n')
    assert metrics.relay(run_dir, client, run_id) == 2
    path = run_dir / "work" / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 3}\n{"step": 2, "loss": 4}\n{"step": 3, "loss": 5}\n')  # same inode
    lines: list[str] = []
    assert metrics.relay(run_dir, client, run_id, on_line=lines.append) == 3
    assert "relaying it again from its start" in lines[0]
    path.unlink()
    path.write_text('{"step": 4, "loss": 6}\n')  # a new file
    assert metrics.relay(run_dir, client, run_id, on_line=lines.append) == 1
    assert [m.value for m in client.get_metric_history(run_id, "loss")][-1] == 6.0


def test_the_result_record_is_read_as_untrusted(tmp_path):
    import json

    from trainyard.pipeline import built_in_result
    from trainyard.training.run_config import WorkerOutputError

    work = tmp_path / "work"
    work.mkdir()
    (work / "model.pt").write_bytes(b"weights")
    written = {"steps": 4, "model_path": "/etc/shadow", "val_acc": 0.5, "onnx_path": "/etc/shadow"}
    (work / "train_result.json").write_text(json.dumps(written))
    # the model where the platform expects it, the loop's fields and val_* metrics, nothing else
    assert built_in_result(tmp_path) == {"steps": 4, "model_path": str(work / "model.pt"), "val_acc": 0.5}
    for bad in ([1], {"x": {"nested": 1}}, {"Bad Name": 1}):
        (work / "train_result.json").write_text(json.dumps(bad))
        with pytest.raises(WorkerOutputError, match="plain values"):
            built_in_result(tmp_path)
    (work / "train_result.json").write_text("{}")
    (work / "model.pt").unlink()
    (work / "model.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(WorkerOutputError, match="not a regular file of its own"):
        built_in_result(tmp_path)


def test_the_final_pass_relays_a_last_line_without_its_newline(tmp_path, mlflow_run):
    """A custom program that ended without the last newline: gated on, so it must reach MLflow too."""
    from trainyard.training import metrics

    _, client, _ = mlflow_run
    run_id = client.create_run(client.get_experiment_by_name("t").experiment_id).info.run_id
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 1, "acc": 0.5}\n{"step": 2, "acc": 0.9}')
    assert metrics.relay(run_dir, client, run_id) == 1  # while it runs, the line may still be being written
    assert metrics.relay(run_dir, client, run_id, final=True) == 1
    assert metrics.relay(run_dir, client, run_id, final=True) == 0
    assert [m.value for m in client.get_metric_history(run_id, "acc")] == [0.5, 0.9]


@pytest.mark.parametrize(
    "line, named",
    [
        ('{"step": 1, "acc@1": 0.5}', "metric names ['acc@1'] are not allowed"),
        ('{"step": 99999999999999999999, "acc": 0.5}', "out of range"),
        ('{"step": -1, "acc": 0.5}', "out of range"),
    ],
)
def test_what_mlflow_would_refuse_is_refused_naming_the_line(tmp_path, mlflow_run, line, named):
    from trainyard.training import metrics

    _, client, run_id = mlflow_run
    run_dir = _run_dir_with_metrics(tmp_path, '{"step": 0, "acc": 0.1}\n' + line + "\n")
    with pytest.raises(metrics.WorkerOutputError, match=rf"metrics.jsonl:2: .*{re.escape(named)}"):
        metrics.relay(run_dir, client, run_id)
