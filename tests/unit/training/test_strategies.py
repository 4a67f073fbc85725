"""The strategy seam: which class runs a spec, and the device rule every GPU path shares."""

import pytest
import torch

from trainyard.errors import PermanentError
from trainyard.spec import parse_spec
from trainyard.training import strategies
from trainyard.training.run_config import RunConfig
from trainyard.training.strategies.base import cuda_device


@pytest.mark.parametrize(
    "name, cls", [("ddp", "DDPStrategy"), ("horovod", "HorovodStrategy"), ("deepspeed", "DeepSpeedStrategy")]
)
def test_the_spec_picks_the_strategy(tmp_path, name, cls):
    cfg = RunConfig(spec=parse_spec({"distributed": {"strategy": name}}), out_dir=str(tmp_path))
    strategy = strategies.for_run(cfg)  # constructing imports no framework and starts nothing
    assert type(strategy).__name__ == cls and strategy.name == name
    assert strategy.ckpts.dir == tmp_path / "checkpoints"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine with fewer GPUs than asked")
def test_a_missing_gpu_names_the_field():
    with pytest.raises(PermanentError, match=r"LOCAL_RANK 1 found 0 CUDA device\(s\): resources.gpus_per_node"):
        cuda_device(1)


def test_a_world_of_one_has_no_process_group(tmp_path, monkeypatch):
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # torchrun --nproc_per_node=1 sets it
    strategy = strategies.for_run(RunConfig(spec=parse_spec({}), out_dir=str(tmp_path)))
    strategy.init()
    strategy.prepare(torch.nn.Linear(2, 1), total_steps=4)
    assert not dist.is_initialized() and strategy.forward is strategy.model
    assert (strategy.rank, strategy.world) == (0, 1)
