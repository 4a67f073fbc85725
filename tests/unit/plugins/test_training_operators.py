"""The training operators without a cluster: what they build from a JobSpec, that construction connects to
nothing, and the order of cluster calls in execute against a recording fake of the provider's clients."""

from types import SimpleNamespace
from unittest import mock

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException

from trainyard.training.launchers import kubernetes as K
from trainyard_airflow.operators.training import KubernetesTrainingJobOperator, KubernetesTrainingPodOperator

RUN_KEY = "train_pipeline/manual__2026-05-01T10:00:00+00:00"
CONFIG = "/var/trainyard/runs/digits/run/run_config.json"
SPEC = {
    "name": "digits",
    "backends": {"launcher": "kubernetes"},
    "resources": {"nodes": 2, "gpus_per_node": 4, "gpu_type": "h100-80gb", "team": "vision"},
    "distributed": {"strategy": "ddp"},
    "kubernetes": {
        "namespace": "ml",
        "priority_class": "train-high",
        "node_selector": {"pool": "training"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "env": {"WANDB_MODE": "offline"},
    },
}
SINGLE = {**SPEC, "resources": {**SPEC["resources"], "nodes": 1}}


def job_op(spec=SPEC, **kwargs) -> KubernetesTrainingJobOperator:
    return KubernetesTrainingJobOperator(task_id="train", spec=spec, run_key=RUN_KEY, config_path=CONFIG, **kwargs)


def context(try_number=3):
    pushed = {}
    ti = SimpleNamespace(dag_id="train_pipeline", task_id="train", map_index=-1, try_number=try_number,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    return {"ti": ti, "run_id": "manual__2026-05-01T10:00:00+00:00", "dag": SimpleNamespace(), "pushed": pushed}


@pytest.fixture
def no_cluster(monkeypatch):
    """Any attempt to reach a cluster fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("tried to connect to Kubernetes")

    monkeypatch.setattr(KubernetesHook, "__init__", refuse)
    monkeypatch.setattr("kubernetes.config.load_kube_config", refuse)
    monkeypatch.setattr("kubernetes.config.load_incluster_config", refuse)


def test_the_guard_would_catch_a_connection(no_cluster):
    with pytest.raises(AssertionError, match="tried to connect"):
        job_op().hook  # noqa: B018 - creating the hook is what must fail here


@pytest.mark.parametrize("cls", [KubernetesTrainingJobOperator, KubernetesTrainingPodOperator])
def test_spec_run_key_and_config_path_are_templated(cls):
    assert {"spec", "run_key", "config_path"} <= set(cls.template_fields)


def test_build_job_request_obj_carries_the_spec(no_cluster):
    op = job_op()
    job = op.build_job_request_obj()
    assert job.metadata.namespace == "ml" and job.metadata.name == K.job_name(SPEC, RUN_KEY)
    assert (job.spec.completion_mode, job.spec.parallelism, job.spec.completions, job.spec.backoff_limit) == ("Indexed", 2, 2, 0)
    pod = job.spec.template.spec
    (c,) = pod.containers
    assert c.name == op.base_container_name == "trainer"
    assert c.resources.limits == c.resources.requests == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}
    assert pod.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "training"}
    assert [(t.key, t.value, t.effect) for t in pod.tolerations] == [("dedicated", "ml", "NoSchedule")]
    assert pod.priority_class_name == "train-high"
    assert {"WANDB_MODE": "offline", "TRAINYARD_HOME": "/var/trainyard"}.items() <= {e.name: e.value for e in c.env}.items()
    assert job.spec.template.metadata.labels == job.metadata.labels == K.run_labels(SPEC, RUN_KEY)
    # What the provider's pod discovery reads.
    assert op.parallelism == op.completions == 2
    assert op.pod_request_obj.metadata.namespace == "ml" and op.labels == K.run_labels(SPEC, RUN_KEY)


def test_task_instance_labels_and_try_number_reach_the_pods(no_cluster):
    ctx = context(try_number=3)
    job = job_op().build_job_request_obj(ctx)
    labels = job.spec.template.metadata.labels
    assert labels["dag_id"] == "train_pipeline" and labels["task_id"] == "train" and labels["try_number"] == "3"
    assert labels["trainyard.io/run"] == K.run_hash(RUN_KEY)
    assert job.metadata.name.endswith("-3")


def test_cluster_policy_applies(no_cluster, monkeypatch):
    def policy(pod):
        pod.metadata.labels["policy"] = "applied"

    monkeypatch.setattr("airflow.settings.pod_mutation_hook", policy)
    assert job_op().build_job_request_obj().spec.template.metadata.labels["policy"] == "applied"
    assert single_op().build_pod_request_obj().metadata.labels["policy"] == "applied"


def single_op(spec=SINGLE):
    return KubernetesTrainingPodOperator(task_id="train", spec=spec, run_key=RUN_KEY, config_path=CONFIG)


def test_build_pod_request_obj_carries_the_spec(no_cluster):
    op = single_op()
    pod = op.build_pod_request_obj(context(try_number=2))
    assert pod.metadata.namespace == "ml" and pod.metadata.name == K.job_name(SINGLE, RUN_KEY, attempt=2)
    (c,) = pod.spec.containers
    assert c.resources.limits["nvidia.com/gpu"] == "4" and "--standalone" in c.command
    assert pod.spec.node_selector["pool"] == "training" and pod.spec.priority_class_name == "train-high"
    assert pod.metadata.labels["try_number"] == "2" and pod.metadata.labels["trainyard.io/team"] == "vision"
    assert op.labels == K.run_labels(SINGLE, RUN_KEY)  # find_pod (reattach) selects by these


def test_pod_operator_refuses_more_than_one_node(no_cluster):
    with pytest.raises(ValueError, match="resources.nodes"):
        single_op(SPEC).build_pod_request_obj()


# -- execute against a recording fake of the provider's clients --------------------------------------------
def _pod(index: int, try_number: int = 3) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=f"w{index}", namespace="ml", labels={"try_number": str(try_number)},
                                  annotations={"batch.kubernetes.io/job-completion-index": str(index)}),
        status=k8s.V1PodStatus(phase="Succeeded"),
    )


def _finished(name: str, condition: str) -> k8s.V1Job:
    return k8s.V1Job(metadata=k8s.V1ObjectMeta(name=name, namespace="ml"), status=k8s.V1JobStatus(
        conditions=[k8s.V1JobCondition(type=condition, status="True", reason="BackoffLimitExceeded")]))


def wired(op, *, pod_lists, outcome="Complete"):
    """Give ``op`` fake clients that all record into one mock, so the order of calls can be asserted."""
    cluster = mock.MagicMock()
    ours = K.job_name(SPEC, RUN_KEY, attempt=3)

    def create_job(job):
        job.metadata.uid = "uid-123"
        return job

    cluster.hook.create_job.side_effect = create_job
    cluster.hook.wait_until_job_complete.return_value = _finished(ours, outcome)
    cluster.hook.is_job_failed = KubernetesHook.is_job_failed
    cluster.hook.get_pod.side_effect = lambda name, namespace: _pod(int(name[1:]))
    cluster.core.list_namespaced_pod.side_effect = [k8s.V1PodList(items=items) for items in pod_lists]
    cluster.batch.list_namespaced_job.return_value = k8s.V1JobList(items=[
        k8s.V1Job(metadata=k8s.V1ObjectMeta(name=K.job_name(SPEC, RUN_KEY, attempt=2))),
        k8s.V1Job(metadata=k8s.V1ObjectMeta(name=ours)),
    ])
    op.__dict__.update(hook=cluster.hook, client=cluster.core, job_client=cluster.batch, pod_manager=cluster.pm)
    op.startup_check_interval_seconds = 0
    return cluster, ours


def _names(cluster) -> list[str]:
    return [c[0] for c in cluster.mock_calls if not c[0].startswith("hook.is_job_failed")]


def test_execute_creates_waits_reads_every_log_then_removes_the_service():
    op = job_op()
    cluster, ours = wired(op, pod_lists=[[_pod(1)], [_pod(1), _pod(0)]])  # the 2nd pod shows up late
    ctx = context()
    op.execute(ctx)

    calls = _names(cluster)
    assert calls.index("batch.delete_namespaced_job") < calls.index("hook.create_job")
    cluster.batch.delete_namespaced_job.assert_called_once_with(
        name=K.job_name(SPEC, RUN_KEY, attempt=2), namespace="ml", propagation_policy="Background")
    assert calls.index("hook.create_job") < calls.index("core.create_namespaced_service")
    service = cluster.core.create_namespaced_service.call_args.kwargs["body"]
    assert service.spec.cluster_ip == "None" and service.metadata.name == ours
    assert [(o.kind, o.name, o.uid) for o in service.metadata.owner_references] == [("Job", ours, "uid-123")]
    assert cluster.core.list_namespaced_pod.call_count == 2  # waited for both pods
    selector = cluster.core.list_namespaced_pod.call_args.kwargs["label_selector"]
    assert f"batch.kubernetes.io/job-name={ours}" in selector and "trainyard.io/run=" in selector
    logs = [c.kwargs["pod"].metadata.name for c in cluster.pm.fetch_requested_container_logs.call_args_list]
    assert logs == ["w0", "w1"]  # every worker, in index order
    assert calls.index("core.delete_namespaced_service") > max(
        i for i, n in enumerate(calls) if n == "pm.fetch_requested_container_logs")
    cluster.core.delete_namespaced_service.assert_called_once_with(name=ours, namespace="ml")
    assert ctx["pushed"]["job_name"] == ours


def test_a_failed_job_fails_the_task_after_its_logs_and_is_removed():
    op = job_op()
    cluster, ours = wired(op, pod_lists=[[_pod(0), _pod(1)]], outcome="Failed")
    with pytest.raises(AirflowException, match="BackoffLimitExceeded"):
        op.execute(context())
    assert cluster.pm.fetch_requested_container_logs.call_count == 2
    cluster.batch.delete_namespaced_job.assert_called_with(name=ours, namespace="ml", propagation_policy="Background")
    cluster.core.delete_namespaced_service.assert_called_once_with(name=ours, namespace="ml")


def test_a_cluster_error_fails_the_task_once_no_retry_loop():
    op = job_op()
    cluster, _ = wired(op, pod_lists=[])
    cluster.hook.create_job.side_effect = ApiException(status=503, reason="Service Unavailable")
    with pytest.raises(ApiException):
        op.execute(context())
    assert cluster.hook.create_job.call_count == 1
    cluster.core.list_namespaced_pod.assert_not_called()


def test_missing_pods_fail_with_a_reason():
    op = job_op(startup_timeout_seconds=0)
    cluster, ours = wired(op, pod_lists=[[_pod(0)]])
    with pytest.raises(AirflowException, match=rf"created 1 of 2 pods .*kubectl describe job {ours}"):
        op.execute(context())
    cluster.batch.delete_namespaced_job.assert_called_with(name=ours, namespace="ml", propagation_policy="Background")


def test_deferred_run_keeps_the_service_until_it_resumes():
    op = job_op(deferrable=True)
    cluster, ours = wired(op, pod_lists=[[_pod(0), _pod(1)]])
    with pytest.raises(TaskDeferred):
        op.execute(context())
    cluster.core.delete_namespaced_service.assert_not_called()
    assert ours not in [c.kwargs.get("name") for c in cluster.batch.delete_namespaced_job.call_args_list]

    resumed = job_op(deferrable=True)  # a new instance, as after the triggerer hands the task back
    cluster2, _ = wired(resumed, pod_lists=[])
    event = {"status": "success", "job": {"metadata": {"namespace": "ml"}}, "pod_names": ["w0", "w1"],
             "pod_namespace": "ml", "xcom_result": None}
    resumed.execute_complete(context(), event)
    assert [c.kwargs["name"] for c in cluster2.core.read_namespaced_pod_log.call_args_list] == ["w0", "w1"]
    cluster2.core.delete_namespaced_service.assert_called_once_with(name=ours, namespace="ml")
