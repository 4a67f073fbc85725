import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainyard_airflow.policy import reservation, task_instance_mutation_hook


def _ti(pool="gpu-cpu", task_id="train"):
    return SimpleNamespace(pool=pool, pool_slots=2, priority_weight=1, task_id=task_id)


@pytest.mark.parametrize(
    "conf, expected",
    [
        ({}, None),
        (None, None),
        ({"resources": {"gpu_type": "h100-80gb", "gpus_per_node": 1, "priority": 50}}, ("gpu-h100-80gb", 1, 1050)),
        ({"resources": {"gpus_per_node": 2}}, ("gpu-cpu", 2, 1001)),
        ({"resources": {"gpus_per_node": -1}}, None),  # invalid: left for validate_spec to reject
        # the trigger form's shape: a key per field
        (
            {"resources.gpu_type": "a100-80gb", "resources.nodes": 1, "resources.gpus_per_node": 4},
            ("gpu-a100-80gb", 4, 1001),
        ),
        ({"resources": {"gpus_per_node": 2}, "resources.gpus_per_node": 4}, None),  # given twice: validate_spec says
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


def test_each_node_s_task_of_a_local_multi_node_job_holds_its_node_s_gpus_and_a_kubernetes_one_all():
    run = SimpleNamespace(conf={"resources": {"gpu_type": "a100-80gb", "nodes": 3, "gpus_per_node": 2}})
    first, other, pods = _ti(), _ti(task_id="train_node"), _ti(task_id="train_kubernetes")
    for ti in (first, other, pods):
        task_instance_mutation_hook(ti, dag_run=run)
    assert [(ti.pool, ti.pool_slots) for ti in (first, other, pods)] == [("gpu-a100-80gb", 2)] * 2 + [
        ("gpu-a100-80gb", 6)
    ]


def test_with_a_training_queue_set_trainings_go_to_their_gpu_type_s_queue_and_nothing_else_does(monkeypatch):
    run = SimpleNamespace(conf={})
    monkeypatch.setenv("AIRFLOW__TRAINYARD__TRAINING_QUEUE", "gpu")
    training, other = _ti(), _ti(pool="default_pool")
    training.queue = other.queue = "cpu"
    task_instance_mutation_hook(training, dag_run=run)
    task_instance_mutation_hook(other, dag_run=run)
    assert (training.queue, other.queue) == ("gpu-cpu", "cpu")  # the DAG's own pool: its default type's queue
    h100 = _ti()
    task_instance_mutation_hook(h100, dag_run=SimpleNamespace(conf={"resources": {"gpu_type": "h100-80gb"}}))
    assert (h100.pool, h100.queue) == ("gpu-h100-80gb", "gpu-h100-80gb")  # the run's type, not the DAG's
    rerun = _ti(pool="gpu-a100-80gb")  # a task created before the run was at hand keeps its pool's queue
    task_instance_mutation_hook(rerun, dag_run=None)
    assert rerun.queue == "gpu-a100-80gb"
    # as Airflow makes a task instance: the hook without the run first, then with it
    pods = _ti()
    pods.task = SimpleNamespace(queue="cpu")  # the operator's own queue ([operators] default_queue)
    pods.queue = "cpu"
    kubernetes = {"backends": {"launcher": "kubernetes"}, "resources": {"gpu_type": "h100-80gb"}}
    task_instance_mutation_hook(pods, dag_run=None)
    assert pods.queue == "gpu-cpu"  # the DAG's own pool's, until the run is at hand
    task_instance_mutation_hook(pods, dag_run=SimpleNamespace(conf=kubernetes))
    assert (pods.pool, pods.queue) == ("gpu-h100-80gb", "cpu")  # its pods get GPUs on the cluster, not its worker
    local = _ti()
    task_instance_mutation_hook(local, dag_run=None)
    task_instance_mutation_hook(local, dag_run=SimpleNamespace(conf={"resources": {"gpu_type": "a100-80gb"}}))
    assert (local.pool, local.queue) == ("gpu-a100-80gb", "gpu-a100-80gb")
    mig = _ti()
    task_instance_mutation_hook(
        mig, dag_run=SimpleNamespace(conf={"resources": {"gpu_type": "a100-mig", "mig_profile": "1g.10gb"}})
    )
    assert (mig.pool, mig.queue) == ("gpu-a100-mig.1g.10gb", "gpu-a100-mig.1g.10gb")  # its profile's slices
    monkeypatch.delenv("AIRFLOW__TRAINYARD__TRAINING_QUEUE")
    unset = _ti()
    unset.queue = "default"
    task_instance_mutation_hook(unset, dag_run=run)
    assert unset.queue == "default"


def _pod(**changes):
    """A pod as trainyard builds it for a default-team job, with ``changes`` made after (another policy, a
    hand-built operator)."""
    from trainyard.spec import parse_spec
    from trainyard.training.launchers.kubernetes import PodRequest, build_pod

    spec = parse_spec({"backends": {"launcher": "kubernetes"}, "resources": {"gpus_per_node": 1}})
    pod = build_pod(PodRequest(spec, "train_pipeline/manual__1", "/var/trainyard/runs/digits/r/run_config.json"))
    for path, value in changes.items():
        target = pod
        *parents, name = path.split(".")
        for part in parents:
            target = getattr(target, part) if not part.isdigit() else target[int(part)]
        setattr(target, name, value)
    return pod


def test_a_pod_as_trainyard_builds_it_passes_the_pod_policy_unchanged():
    from kubernetes.client import ApiClient

    from trainyard_airflow.policy import pod_mutation_hook

    pod = _pod()
    before = ApiClient().sanitize_for_serialization(pod)
    assert pod.metadata.labels["trainyard.io/team"] == "default"  # a team's pod: the hook checks it
    assert pod_mutation_hook(pod) is None
    assert ApiClient().sanitize_for_serialization(pod) == before


@pytest.mark.parametrize(
    "changes, named",
    [
        (
            {"metadata.namespace": "kube-system"},
            "kubernetes.namespace: 'kube-system' is not allowed",
        ),
        ({"spec.service_account_name": "cluster-admin"}, "kubernetes.service_account: 'cluster-admin'"),
        ({"spec.containers.0.image": "evil.io/miner:1"}, "containers.trainer.image: 'evil.io/miner:1'"),
        ({"spec.priority_class_name": "no-such-class"}, "kubernetes.priority_class: 'no-such-class'"),
        ({"metadata.labels": {"trainyard.io/team": "nobody"}}, "trainyard.io/team='nobody' is no team"),
    ],
)
def test_a_pod_changed_after_the_spec_check_is_refused_naming_what(changes, named):
    """The cluster policy checks the pod itself: what a JobSpec check cannot see (a mutation after it) is
    caught where the pod is made."""
    from trainyard.spec import SpecError
    from trainyard_airflow.policy import pod_mutation_hook

    with pytest.raises(SpecError, match=re.escape(named)):
        pod_mutation_hook(_pod(**changes))


def test_a_pod_that_is_not_trainyards_is_left_alone(monkeypatch):
    """No team label: no check, nothing of resources.yaml read, the pod as it was, however far it is
    from a team's policy."""
    from kubernetes.client import ApiClient
    from kubernetes.client import models as k8s

    from trainyard.scheduling import resources
    from trainyard_airflow.policy import pod_mutation_hook

    def read(*args, **kwargs):
        raise AssertionError("resources.yaml was read for a pod that is not trainyard's")

    monkeypatch.setattr(resources, "resources_in_force", read)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(namespace="kube-system", labels={"app": "other"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="anything")]),
    )
    before = ApiClient().sanitize_for_serialization(pod)
    pod_mutation_hook(pod)
    assert ApiClient().sanitize_for_serialization(pod) == before
    with pytest.raises(AssertionError, match="was read"):  # the same hook does read it for a team's pod
        pod_mutation_hook(_pod())


def test_a_typo_in_resources_yaml_fails_no_pod_the_last_good_file_holds(trainyard_home, tmp_path, monkeypatch):
    """The pod hook reads the resources in force, as the queue does: a broken edit is named in the log
    and the last good version decides (it failed every Kubernetes launch with load_resources)."""
    import shutil

    from trainyard.spec import SpecError
    from trainyard_airflow.policy import pod_mutation_hook

    config = tmp_path / "config"
    shutil.copytree(Path(__file__).resolve().parents[3] / "include" / "config", config)
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))
    pod_mutation_hook(_pod())  # read as it is, and kept as the last good version
    resources = config / "resources.yaml"
    resources.write_text(resources.read_text().replace("count: 2", "count: two", 1))
    pod_mutation_hook(_pod())
    with pytest.raises(SpecError, match="is not allowed"):  # the policy still holds, from the good file
        pod_mutation_hook(_pod(**{"metadata.namespace": "kube-system"}))
