from types import SimpleNamespace

import pytest

from trainyard_airflow.policy import reservation, task_instance_mutation_hook


def _ti(pool="gpu-cpu"):
    return SimpleNamespace(pool=pool, pool_slots=2, priority_weight=1)


@pytest.mark.parametrize(
    "conf, expected",
    [
        ({}, None),
        (None, None),
        ({"resources": {"gpu_type": "h100-80gb", "gpus_per_node": 1, "priority": 50}}, ("gpu-h100-80gb", 1, 1050)),
        ({"resources": {"gpus_per_node": 2}}, ("gpu-cpu", 2, 1001)),
        ({"resources": {"gpus_per_node": -1}}, None),  # invalid: left for validate_spec to reject
    ],
)
def test_reservation(conf, expected):
    assert reservation(conf) == expected


def test_hook_routes_gpu_tasks_only():
    run = SimpleNamespace(conf={"resources": {"gpu_type": "a100-80gb", "gpus_per_node": 1, "priority": 9}})
    ti = _ti()
    task_instance_mutation_hook(ti, dag_run=run)
    assert (ti.pool, ti.pool_slots, ti.priority_weight) == ("gpu-a100-80gb", 1, 1009)
    other = _ti(pool="default_pool")
    task_instance_mutation_hook(other, dag_run=run)
    assert (other.pool, other.pool_slots) == ("default_pool", 2)
    untouched = _ti()
    task_instance_mutation_hook(untouched, dag_run=None)
    assert untouched.pool_slots == 2
