import pytest
import torch

from trainyard.training.common import Checkpoints


def _state(step):
    return {"model": {"w": torch.full((2,), float(step))}, "step": step}


def test_keeps_the_last_k_newest_first(tmp_path):
    ckpts = Checkpoints(tmp_path, every_steps=10, keep=2)
    for step in (10, 20, 30):
        ckpts.save(_state(step), step)
    assert [p.name for p in ckpts.files()] == ["step-00000030.pt", "step-00000020.pt"]
    assert ckpts.load_latest()["step"] == 30


def test_corrupt_newest_falls_back_to_the_previous(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=3)
    ckpts.save(_state(10), 10)
    ckpts.save(_state(20), 20)
    newest = ckpts.files()[0]
    newest.write_bytes(newest.read_bytes()[:40])  # truncated, as a crash mid-copy would leave it
    seen = []
    state = ckpts.load_latest(seen.append)
    assert state["step"] == 10 and state["_path"] == "step-00000010.pt"
    assert "step-00000020.pt is unreadable" in seen[0]


def test_nothing_to_resume(tmp_path):
    assert Checkpoints(tmp_path / "none").load_latest() is None


def test_interval_rules(tmp_path):
    assert Checkpoints(tmp_path, every_steps=5).due(10, end_of_epoch=False)
    assert not Checkpoints(tmp_path, every_steps=5).due(11, end_of_epoch=True)
    assert Checkpoints(tmp_path).due(7, end_of_epoch=True)  # default: every epoch
    assert not Checkpoints(tmp_path).due(7, end_of_epoch=False)
    assert not Checkpoints(tmp_path, every_minutes=60).due(1, end_of_epoch=True)


def test_no_temp_files_left(tmp_path):
    Checkpoints(tmp_path).save(_state(1), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001.pt"]


def test_background_save_writes_a_snapshot_and_reports_once_on_disk(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=2)
    live = {"model": {"w": torch.zeros(3)}, "optimizer": {"state": [torch.ones(2)]}, "step": 10}
    reported = []

    def on_saved(path):
        reported.append((path.name, path.exists()))

    ckpts.save_in_background(live, 10, on_saved)
    live["model"]["w"].add_(5.0)  # training goes on changing the tensors the snapshot was taken from
    live["optimizer"]["state"][0].mul_(3.0)
    ckpts.close()
    assert reported == [("step-00000010.pt", True)]
    saved = ckpts.load_latest()
    assert saved["model"]["w"].tolist() == [0.0, 0.0, 0.0] and saved["optimizer"]["state"][0].tolist() == [1.0, 1.0]


def test_background_save_failure_is_raised_by_the_next_save_or_close(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ckpts = Checkpoints(blocker / "checkpoints")  # cannot be created: a file is in the way
    ckpts.save_in_background(_state(1), 1, lambda path: None)
    with pytest.raises(OSError):
        ckpts.save_in_background(_state(2), 2, lambda path: None)
    ckpts.save_in_background(_state(3), 3, lambda path: None)
    with pytest.raises(OSError):
        ckpts.close()
    ckpts.close()  # nothing pending any more


def test_close_without_check_prints_the_failure(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ckpts = Checkpoints(blocker / "checkpoints")
    ckpts.save_in_background(_state(1), 1, lambda path: None)
    ckpts.close(check=False)
    assert "checkpoint write failed" in capsys.readouterr().out


def test_a_training_state_loads_with_weights_only_and_a_planted_pickle_does_not_run(tmp_path):
    """What a strategy saves (model, AdamW after a step, the cosine schedule, a GradScaler's state, the
    data position with torch's RNG state) loads as tensors and plain values; a file another user planted
    among the checkpoints, a pickle that calls a function when loaded, is refused without running it."""
    from trainyard.training.common import make_scheduler

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = make_scheduler(opt, 10)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": torch.amp.GradScaler("cpu").state_dict(),
        "epoch": 1, "batches_done": 3, "step": 7, "rng": torch.get_rng_state(),
    }  # fmt: skip
    ckpts = Checkpoints(tmp_path, keep=3)
    ckpts.save(state, 7)
    loaded = ckpts.load_latest()
    assert loaded["step"] == 7 and torch.equal(loaded["rng"], state["rng"])
    assert loaded["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    assert loaded["scheduler"] == sched.state_dict()

    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (marker.write_text, ("code ran",))

    torch.save({"model": Planted(), "step": 99}, tmp_path / "step-00000099.pt")
    seen: list[str] = []
    assert ckpts.load_latest(seen.append)["step"] == 7  # the planted newest one is passed over
    assert not marker.exists() and "step-00000099.pt is unreadable" in seen[0]
