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
