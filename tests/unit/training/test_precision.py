"""distributed.precision: what can train where (check_precision), and that the torch strategies' step
really runs under it."""

import pytest
import torch

from trainyard.spec import JobSpec, parse_spec
from trainyard.training.common import make_optimizer
from trainyard.training.strategies import precision as amp


def _spec(strategy, precision) -> JobSpec:
    return parse_spec({"distributed": {"strategy": strategy, "precision": precision}})


@pytest.mark.parametrize(
    "strategy, precision, cuda, refused",
    [
        (s, p, cuda, p == "fp16" and not cuda)
        for s in ("ddp", "horovod", "deepspeed")
        for p in ("fp32", "bf16", "fp16")
        for cuda in (False, True)
    ],
)
def test_check_precision_table(strategy, precision, cuda, refused):
    spec = _spec(strategy, precision)
    if refused:
        with pytest.raises(
            amp.PrecisionError,
            match=(
                r"distributed\.precision 'fp16' needs CUDA GPUs.*"
                r"allowed on CPU workers: 'fp32' or 'bf16'"
            ),
        ):
            amp.check_precision(spec, cuda)
    else:
        assert amp.check_precision(spec, cuda) is None


def test_the_refusal_is_permanent():
    from trainyard.errors import PermanentError

    with pytest.raises(PermanentError):
        amp.check_precision(_spec("ddp", "fp16"), cuda=False)


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_autocast_on_cpu_runs_the_forward_in_the_precision(precision, dtype):
    layer = torch.nn.Linear(4, 3)
    with amp.autocast(precision, torch.device("cpu")):
        out = layer(torch.randn(2, 4))
    assert out.dtype == dtype and layer.weight.dtype == torch.float32  # the weights stay fp32


def test_grad_scaler_only_for_fp16():
    assert amp.grad_scaler("fp32", torch.device("cpu")) is None
    assert amp.grad_scaler("bf16", torch.device("cpu")) is None
    assert isinstance(amp.grad_scaler("fp16", torch.device("cuda")), torch.amp.GradScaler)


def test_optimizer_momentum_is_the_specs_default():
    """No second default: a spec without momentum trains with the JobSpec's 0.9."""
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))], JobSpec().hyperparameters)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9


def test_adamw_from_the_spec():
    hp = parse_spec({"hyperparameters": {"optimizer": "adamw", "learning_rate": 0.003, "weight_decay": 0.01}})
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))], hp.hyperparameters)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == 0.003 and opt.defaults["weight_decay"] == 0.01


@pytest.mark.parametrize(
    ("launcher", "gpu_type", "refused"),
    [
        ("kubernetes", "cpu", True),  # CPU pods: fp16 cannot train, refused before any data moves
        ("kubernetes", "a100-80gb", False),  # GPU pods
        ("local", "cpu", False),  # this machine's workers decide (they refuse it on a CPU-only machine)
    ],
)
def test_validate_spec_refuses_fp16_only_where_it_knows_the_workers_have_no_cuda(launcher, gpu_type, refused):
    from trainyard.pipeline import validate_spec

    raw = {
        "backends": {"launcher": launcher},
        "distributed": {"precision": "fp16"},
        "resources": {"gpu_type": gpu_type, "gpus_per_node": 1},
    }
    if refused:
        with pytest.raises(amp.PrecisionError, match=r"distributed\.precision"):
            validate_spec(raw)
    else:
        assert validate_spec(raw).distributed.precision == "fp16"
