import pytest

from trainyard.scheduling.resources import check_spec, load_resources, pool_name, pools, run_cost
from trainyard.spec import SpecError, parse_spec


def test_pools_from_the_shipped_resources_file():
    cfg = load_resources()
    result = pools(cfg)
    assert result["gpu-cpu"]["slots"] == cfg.gpu_types["cpu"].count
    assert set(result) == {pool_name(t) for t in cfg.gpu_types}


@pytest.mark.parametrize(
    "resources, field",
    [
        ({"gpu_type": "tpu-v9"}, "resources.gpu_type: unknown GPU type 'tpu-v9'"),
        ({"team": "nobody"}, "resources.team: unknown team"),
        ({"gpu_type": "cpu", "gpus_per_node": 64}, "but pool 'gpu-cpu' has only"),
    ],
)
def test_unschedulable_specs_are_refused(resources, field):
    with pytest.raises(SpecError, match=field):
        check_spec(parse_spec({"resources": resources}), load_resources())


def test_cost_is_price_times_hours_times_gpus():
    cfg = load_resources()
    price = cfg.gpu_types["h100-80gb"].price_per_hour
    assert run_cost(cfg, "h100-80gb", 8, 1800) == pytest.approx(price * 0.5 * 8)
