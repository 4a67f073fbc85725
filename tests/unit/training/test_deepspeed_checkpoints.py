"""DeepSpeedCheckpoints without DeepSpeed: sealing, checking and pruning checkpoint tags (one rank)."""

import json

import pytest
import torch

from trainyard.training.common import Checkpoints
from trainyard.training.strategies.deepspeed import MARKER, DeepSpeedCheckpoints


class FakeEngine:
    """Writes what DeepSpeed writes for 2 ranks under ZeRO-1/2: model states and one optimizer partition each."""

    def save_checkpoint(self, save_dir, tag, client_state):
        from pathlib import Path

        root = Path(save_dir) / tag
        root.mkdir(parents=True, exist_ok=True)
        torch.save({"module": {}, **client_state}, root / "mp_rank_00_model_states.pt")
        for r in range(2):
            torch.save({"partition": torch.arange(10 + r)}, root / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        (Path(save_dir) / "latest").write_text(tag)


def _ckpts(tmp_path, keep=2, every_steps=None):
    lines = []
    c = DeepSpeedCheckpoints(
        Checkpoints(tmp_path / "checkpoints", every_steps=every_steps, keep=keep),
        FakeEngine(),
        0,
        torch.device("cpu"),
        lines.append,
    )
    return c, lines


def _state(step):
    return {"epoch": step // 10, "batches_done": step % 10 or 10, "step": step, "rng": torch.get_rng_state()}


def test_save_seals_and_keeps_the_last_k(tmp_path):
    c, _ = _ckpts(tmp_path, keep=2)
    for step in (10, 20, 30):
        assert c.save(_state(step), step) == f"step-{step:08d}"
    assert c.tags() == ["step-00000030", "step-00000020"]  # newest first; step 10 pruned
    marker = json.loads((c.dir / "step-00000030" / MARKER).read_text())
    assert (marker["epoch"], marker["batches_done"], marker["step"]) == (3, 10, 30)
    assert set(marker["files"]) == {
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    }
    assert all(c.check(t) is None for t in c.tags())
    assert not list(c.dir.glob("step-*/.*.tmp"))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda d: (d / MARKER).unlink(), "incomplete (no trainyard.json"),
        (lambda d: (d / MARKER).write_text("{"), "unreadable trainyard.json"),
        (
            lambda d: (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink(),
            "missing zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ),
        (
            lambda d: (d / "mp_rank_00_model_states.pt").write_bytes(b"x" * 7),
            "mp_rank_00_model_states.pt is 7 bytes, was written as",
        ),
    ],
)
def test_check_names_what_is_wrong(tmp_path, damage, problem):
    c, _ = _ckpts(tmp_path)
    c.save(_state(10), 10)
    damage(c.dir / "step-00000010")
    assert problem in c.check("step-00000010")


def test_prune_counts_complete_tags_only_and_drops_older_partial_ones(tmp_path):
    c, _ = _ckpts(tmp_path, keep=2)
    c.save(_state(10), 10)
    (c.dir / "step-00000005").mkdir()  # a save cut short long ago
    (c.dir / "step-00000040").mkdir()  # a save cut short just now (newer than any complete tag)
    c.save(_state(20), 20)
    assert c.tags() == ["step-00000040", "step-00000020", "step-00000010"]
    c.save(_state(30), 30)
    # keep=2 complete tags (30, 20); everything older goes; the newer partial one stays until overwritten.
    assert c.tags() == ["step-00000040", "step-00000030", "step-00000020"]
    assert "incomplete" in c.check("step-00000040")
    assert not (c.dir / "not-a-tag").exists() and (c.dir / "latest").read_text() == "step-00000030"


def test_due_follows_checkpoints(tmp_path):
    c, _ = _ckpts(tmp_path, every_steps=5)
    assert [s for s in range(1, 16) if c.due(s, False, world=2)] == [5, 10, 15]
    c, _ = _ckpts(tmp_path)
    assert c.due(7, True, world=1) and not c.due(7, False, world=1)  # default: at the end of each epoch
