"""The Kubernetes training operators with the provider's own classes against an in-process fake of the
Kubernetes REST API (``kube_fake``): what execute creates is deleted on kill, timeout, deferral timeout and
any exception; waiting is deferred to a trigger; each try records the pods' running time, not queue time."""

import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout, TaskDeferralTimeout, TaskDeferred
from kube_fake import FakeKubernetes

from datafiles import prepared_in
from trainyard.spec import parse_spec, safe_key
from trainyard.training import usage
from trainyard.training.launchers import kubernetes as K
from trainyard.training.run_config import RunConfig
from trainyard_airflow.operators.launch import KubernetesTrainingLauncher
from trainyard_airflow.operators.training import (
    KubernetesTrainingJobOperator,
    KubernetesTrainingPodOperator,
    training_operator,
)
from trainyard_airflow.triggers.training_job import TrainingJobTrigger

RUN_KEY = "train_pipeline/manual__2026-05-01T10:00:00+00:00"
SPEC = {
    "name": "digits",
    "backends": {"launcher": "kubernetes"},
    "resources": {"nodes": 2, "gpus_per_node": 4, "gpu_type": "h100-80gb", "team": "vision"},
    "distributed": {"strategy": "ddp"},
    "kubernetes": {
        "namespace": "trainyard-vision",
        "priority_class": "high",
        "node_selector": {"pool": "training"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "env": {"WANDB_MODE": "offline"},
        "schedule_timeout_s": 7200,
    },
}
SPEC_MODEL = parse_spec(SPEC)  # what the library's builders take
SINGLE = {**SPEC, "resources": {**SPEC["resources"], "nodes": 1}}
CREATED, STARTED, FINISHED = 1_000.0, 1_600.0, 1_900.0  # ten minutes queued, five running


@pytest.fixture
def cluster(monkeypatch):
    fake = FakeKubernetes()
    # The hook's one way to a cluster; everything above it (clients, hook, PodManager) is the real code.
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: fake.api_client())
    return fake


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run on the worker's TRAINYARD_HOME (the shared volume): prepared data and the run config."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    prepared = home / "cache" / "prepared" / "abc"
    prepared.mkdir(parents=True)
    run_dir = home / "runs" / "digits" / safe_key(RUN_KEY)  # where the pipeline puts the run's files
    run_dir.mkdir(parents=True)

    def config(spec: dict, run_key: str = RUN_KEY) -> str:
        """The run config where plan_kubernetes writes it: in the run's own directory (the operators hold
        ``config_path`` to that)."""
        folder = home / "runs" / parse_spec(spec).name / safe_key(run_key)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = RunConfig(spec=parse_spec(spec), data=prepared_in(prepared), out_dir=str(folder))
        return str(cfg.dump(folder / "run_config.json"))

    return SimpleNamespace(home=home, run_dir=run_dir, config=config)


def context(try_number: int = 3) -> dict:
    pushed: dict = {}
    ti = SimpleNamespace(
        dag_id="train_pipeline",
        task_id="train_kubernetes",
        map_index=-1,
        try_number=try_number,
        start_date=datetime.now(tz=UTC),
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )
    # params: the run's, as Airflow resolves them (the job these tests run is SPEC's, "digits")
    params = {"name": SPEC["name"]}
    run_id = "manual__2026-05-01T10:00:00+00:00"
    return {"ti": ti, "run_id": run_id, "dag": SimpleNamespace(), "pushed": pushed, "params": params}


class AsyncHook:
    """The provider's async hook as the triggers use it, answered by the fake (``api``: its client): its pods
    and Jobs, and a Job that does not end of itself."""

    def __init__(self, api) -> None:
        self.api = api

    async def get_pod(self, name, namespace):
        from kubernetes import client

        return client.CoreV1Api(self.api).read_namespaced_pod(name=name, namespace=namespace)

    async def get_job_status(self, name, namespace):
        from kubernetes import client

        return client.BatchV1Api(self.api).read_namespaced_job_status(name=name, namespace=namespace)

    async def wait_until_job_complete(self, name, namespace, poll_interval):
        import asyncio

        await asyncio.sleep(3600)


def launcher(run, spec=SPEC, **kwargs) -> KubernetesTrainingLauncher:
    return KubernetesTrainingLauncher(
        task_id="train_kubernetes", spec=spec, run_key=RUN_KEY, config_path=run.config(spec), poll_interval=0, **kwargs
    )


def nothing_left(cluster: FakeKubernetes) -> bool:
    return cluster.names("jobs") == cluster.names("services") == cluster.names("pods") == []


# -- the parse-light front -----------------------------------------------------------------------------------
def test_the_front_builds_the_operator_the_spec_needs(run):
    spec_two, spec_one = parse_spec(SPEC), parse_spec(SINGLE)
    job = launcher(run).operator()
    assert isinstance(job, KubernetesTrainingJobOperator) and job.deferrable
    assert job.schedule_timeout_seconds == job.startup_timeout_seconds == spec_two.kubernetes.schedule_timeout_s
    pod = launcher(run, SINGLE).operator()
    assert isinstance(pod, KubernetesTrainingPodOperator) and pod.deferrable
    assert pod.schedule_timeout_seconds == spec_one.kubernetes.schedule_timeout_s
    assert pod.startup_timeout_seconds < pod.schedule_timeout_seconds  # image pull: shorter than a queue
    assert {"spec", "run_key", "config_path"} <= set(KubernetesTrainingLauncher.template_fields)


@pytest.mark.parametrize("cls", [KubernetesTrainingJobOperator, KubernetesTrainingPodOperator])
def test_spec_run_key_and_config_path_are_templated(cls):
    assert {"spec", "run_key", "config_path"} <= set(cls.template_fields)


def test_a_config_path_other_than_the_run_s_own_is_refused(run, tmp_path):
    """config_path comes from plan_kubernetes's XCom, which a user may write: the pods never start from (and
    the launcher never writes beside) another run's run config."""
    from trainyard.teams import NotAllowed
    from trainyard_airflow.operators.training import training_operator

    other = run.config({**SPEC, "name": "vision-net"})  # a real run config, of another job
    op = training_operator(spec=SPEC, task_id="t", run_key=RUN_KEY, config_path=other, poll_interval=1)
    with pytest.raises(NotAllowed, match="is not run .*'s run config"):
        op.build_job_request_obj(context())


def test_building_connects_to_nothing(run, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tried to connect to Kubernetes")

    monkeypatch.setattr(KubernetesHook, "get_conn", refuse)
    job = launcher(run).operator().build_job_request_obj(context())
    assert job.metadata.name == K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    pod = launcher(run, SINGLE).operator().build_pod_request_obj(context())
    assert pod.metadata.labels["try_number"] == "3"


def test_build_job_request_obj_carries_the_spec_and_the_pods_paths(run):
    op = launcher(run).operator()
    job = op.build_job_request_obj(context())
    assert job.metadata.namespace == "trainyard-vision"
    assert (job.spec.completion_mode, job.spec.parallelism, job.spec.completions, job.spec.backoff_limit) == (
        "Indexed",
        2,
        2,
        0,
    )
    (c,) = job.spec.template.spec.containers
    assert c.resources.limits == c.resources.requests == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}
    env = {e.name: e.value for e in c.env}
    assert env["WANDB_MODE"] == "offline"
    assert env["TRAINYARD_RUN_CONFIG"] == f"/var/trainyard/runs/digits/{safe_key(RUN_KEY)}/{K.POD_CONFIG}"
    assert c.command[-2:] == ["--config", env["TRAINYARD_RUN_CONFIG"]]
    labels = job.spec.template.metadata.labels
    assert labels["dag_id"] == "train_pipeline" and labels["try_number"] == "3"
    assert labels["trainyard.io/run"] == K.run_hash(RUN_KEY)
    assert op.parallelism == op.completions == 2 and op.labels == K.run_labels(SPEC_MODEL, RUN_KEY)


def test_cluster_policy_applies(run, monkeypatch):
    monkeypatch.setattr("airflow.settings.pod_mutation_hook", lambda pod: pod.metadata.labels.update(policy="applied"))
    assert launcher(run).operator().build_job_request_obj().spec.template.metadata.labels["policy"] == "applied"
    assert launcher(run, SINGLE).operator().build_pod_request_obj().metadata.labels["policy"] == "applied"


def test_a_cluster_policy_that_strips_the_team_label_takes_no_pod_past_the_team_s_check(run, monkeypatch):
    """Policies of installed packages run after trainyard's own hook: one that removes the team label (and
    moves the pod into kube-system) must not leave the pod unchecked; the operators check their own pods
    whatever their labels say."""
    from trainyard.spec import SpecError

    def strip(pod):
        pod.metadata.labels.pop("trainyard.io/team", None)
        pod.metadata.namespace = "kube-system"

    monkeypatch.setattr("airflow.settings.pod_mutation_hook", strip)
    with pytest.raises(SpecError, match="trainyard.io/team=None is no team"):
        launcher(run, SINGLE).operator().build_pod_request_obj()


def test_a_spec_naming_another_job_than_the_run_s_is_refused_creating_nothing(run, cluster):
    """``spec`` is validate_spec's XCom: one rewritten to name another job (whose run directory and MLflow
    runs are another team's) is refused at execute and at every resume."""
    from trainyard.teams import NotAllowed

    op = launcher(run, {**SPEC, "name": "vision-net"})
    for call in (lambda: op.execute(context()), lambda: op.execute_complete(context(), {"status": "success"})):
        with pytest.raises(NotAllowed, match="names job 'vision-net', but the run is of job 'digits'"):
            call()
    assert nothing_left(cluster)


def test_pod_operator_refuses_more_than_one_node(run):
    op = KubernetesTrainingPodOperator(task_id="t", spec=SPEC, run_key=RUN_KEY, config_path=run.config(SPEC))
    with pytest.raises(ValueError, match="resources.nodes"):
        op.build_pod_request_obj()


# -- multi-node: an Indexed Job and its Service --------------------------------------------------------------
def test_execute_creates_the_job_and_service_and_defers_to_the_providers_trigger(run, cluster):
    with pytest.raises(TaskDeferred) as deferred:
        launcher(run).execute(context())
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    trigger = deferred.value.trigger
    assert isinstance(trigger, KubernetesJobTrigger) and isinstance(trigger, TrainingJobTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert (trigger.job_name, trigger.job_namespace, trigger.service_name) == (name, "trainyard-vision", name)
    assert trigger.pod_names == [p["metadata"]["name"] for p in cluster.pods_of(name)] and len(trigger.pod_names) == 2
    assert trigger.schedule_timeout == 7200  # kubernetes.schedule_timeout_s
    classpath, kwargs = trigger.serialize()
    assert classpath == "trainyard_airflow.triggers.training_job.TrainingJobTrigger"
    assert TrainingJobTrigger(**kwargs).serialize() == (classpath, kwargs)  # the triggerer rebuilds it
    # Still running: nothing is deleted while deferred.
    assert cluster.names("jobs") == cluster.names("services") == [name]
    service = cluster.objects[("services", "trainyard-vision", name)]
    assert service["spec"]["clusterIP"] == "None"
    assert (
        service["metadata"]["ownerReferences"][0]["uid"]
        == cluster.objects[("jobs", "trainyard-vision", name)]["metadata"]["uid"]
    )


def _event(cluster, name, status="success"):
    job = cluster.objects[("jobs", "trainyard-vision", name)]
    return {
        "name": name,
        "namespace": "trainyard-vision",
        "pod_names": [p["metadata"]["name"] for p in cluster.pods_of(name)],
        "pod_namespace": "trainyard-vision",
        "status": status,
        "message": "Job failed" if status == "error" else "ok",
        "job": job,
        "xcom_result": None,
    }


def test_execute_complete_reads_every_log_records_running_time_and_removes_the_service(run, cluster, capsys):
    with pytest.raises(TaskDeferred):
        launcher(run).execute(context())
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    pods = cluster.pods_of(name)
    for i, pod in enumerate(pods):
        cluster.logs[pod["metadata"]["name"]] = f"[rank {i}]: done\n"
    cluster.finish(pods, started=STARTED, finished=FINISHED)

    launcher(run).execute_complete(context(), _event(cluster, name))  # a fresh instance, as after deferral
    task_log = capsys.readouterr().out
    assert "[rank 0]: done" in task_log and "[rank 1]: done" in task_log
    assert cluster.names("services") == []  # gone after the logs were read
    assert cluster.names("jobs") == [name]  # a success keeps its Job (and logs) until the TTL
    (record,) = usage.tries(run.run_dir)
    assert (record["started"], record["ended"], record["gpus"], record["where"]) == (STARTED, FINISHED, 8, "kubernetes")


def test_a_failed_job_fails_the_task_and_is_deleted(run, cluster):
    with pytest.raises(TaskDeferred):
        launcher(run).execute(context())
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    cluster.finish(cluster.pods_of(name), started=STARTED, finished=FINISHED, exit_code=1)
    with pytest.raises(AirflowException, match="Job failed"):
        launcher(run).execute_complete(context(), _event(cluster, name, "error"))
    assert nothing_left(cluster)
    assert usage.gpu_seconds(run.run_dir) == (FINISHED - STARTED) * 8  # the failed try's time is counted


def test_a_retry_after_the_deadline_used_up_max_hours_fails_at_once_creating_nothing(run, cluster):
    from airflow.sdk.exceptions import AirflowFailException

    spec = {**SPEC, "resources": {**SPEC["resources"], "max_hours": 0.05}}  # 180 s
    usage.record_try(run.run_dir, attempt=1, started=STARTED, ended=STARTED + 180, gpus=8, where="kubernetes")
    with pytest.raises(AirflowFailException, match="max_hours"):  # no retry: a retry cannot help
        launcher(run, spec).execute(context())
    assert nothing_left(cluster)


def _poll_hook(cluster, name, action):
    """Run ``action`` when the operator first polls the Job: it is then waiting, as for a kill or a timeout."""

    def on_request(method, path):
        if method == "GET" and path.endswith(f"/jobs/{name}/status") and not getattr(on_request, "done", False):
            on_request.done = True
            action()

    cluster.on_request = on_request


def test_on_kill_while_waiting_deletes_the_job_and_service(run, cluster):
    op = launcher(run, deferrable=False)
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)

    def kill():
        cluster.schedule(cluster.pods_of(name), started=STARTED)
        assert cluster.names("jobs") == cluster.names("services") == [name]
        op.on_kill()  # what the task runner's SIGTERM handler calls ("mark failed", a timeout)

    _poll_hook(cluster, name, kill)
    with pytest.raises(Exception):  # noqa: B017 - the wait then finds its Job gone; any error will do
        op.execute(context())
    assert nothing_left(cluster)
    (record,) = usage.tries(run.run_dir)
    assert record["started"] == STARTED and record["ended"] > STARTED  # ran until killed


def test_a_timeout_inside_execute_deletes_the_job_and_service(run, cluster):
    op = launcher(run, deferrable=False)
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)

    def timeout():
        raise AirflowTaskTimeout("Timeout, PID: 1")  # raised by the SIGALRM handler, a BaseException

    _poll_hook(cluster, name, timeout)
    with pytest.raises(AirflowTaskTimeout):
        op.execute(context())
    assert nothing_left(cluster)
    assert usage.tries(run.run_dir) == []  # the pods never started: no GPU time to count


def test_any_exception_after_creating_deletes_the_job_and_service(run, cluster):
    op = launcher(run)

    def unavailable():
        raise ConnectionError("the API server went away")

    cluster.on_request = lambda method, path: (
        unavailable() if (method, path) == ("GET", "/api/v1/namespaces/trainyard-vision/pods") else None
    )
    with pytest.raises(ConnectionError):
        op.execute(context())
    cluster.on_request = None
    assert ("POST", "/apis/batch/v1/namespaces/trainyard-vision/jobs") in cluster.requests  # it had been created
    assert nothing_left(cluster), cluster.objects.keys()


def test_a_deferral_that_times_out_deletes_the_job_and_service(run, cluster):
    with pytest.raises(TaskDeferred):
        launcher(run).execute(context())
    cluster.schedule(cluster.pods_of(K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)), started=STARTED)
    with pytest.raises(TaskDeferralTimeout):
        launcher(run).resume_execution("__fail__", {"error": "Trigger timeout"}, context())
    assert nothing_left(cluster)
    assert len(usage.tries(run.run_dir)) == 1


def test_a_retry_removes_jobs_an_earlier_try_left(run, cluster):
    with pytest.raises(TaskDeferred):
        launcher(run).execute(context(try_number=1))
    with pytest.raises(TaskDeferred):
        launcher(run).execute(context(try_number=2))
    assert cluster.names("jobs") == [K.job_name(SPEC_MODEL, RUN_KEY, attempt=2)]
    assert cluster.names("services") == [
        K.job_name(SPEC_MODEL, RUN_KEY, attempt=2)
    ]  # owned by the deleted Job: gone too


def test_missing_pods_fail_with_a_reason_and_clean_up(run, cluster, monkeypatch):
    op = launcher(run).operator()
    op.startup_timeout_seconds = 0
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    original = cluster._create

    def one_pod_admitted(plural, ns, body):  # as if a webhook or quota let only one pod through
        status, obj = original(plural, ns, body)
        if plural == "jobs":
            cluster.objects.pop(("pods", ns, f"{name}-1-x1"))
        return status, obj

    monkeypatch.setattr(cluster, "_create", one_pod_admitted)
    with pytest.raises(AirflowException, match=rf"created 1 of 2 pods .*kubectl describe job {name}"):
        op.execute(context())
    assert nothing_left(cluster)


# -- one node: a bare Pod, the provider's Pod trigger ----------------------------------------------------------
def test_single_node_defers_to_the_providers_pod_trigger_and_cleans_up_when_done(run, cluster, capsys):
    with pytest.raises(TaskDeferred) as deferred:
        launcher(run, SINGLE).execute(context())
    name = K.job_name(parse_spec(SINGLE), RUN_KEY, attempt=3)
    trigger = deferred.value.trigger
    assert isinstance(trigger, KubernetesPodTrigger) and deferred.value.method_name == "trigger_reentry"
    assert (trigger.pod_name, trigger.schedule_timeout) == (name, 7200)
    assert cluster.names("pods") == [name] and cluster.names("jobs") == cluster.names("services") == []

    pod = cluster.objects[("pods", "trainyard-vision", name)]
    cluster.finish([pod], started=STARTED, finished=FINISHED)
    cluster.logs[name] = "[rank 0]: done\n"
    launcher(run, SINGLE).trigger_reentry(
        context(),
        {"status": "success", "name": name, "namespace": "trainyard-vision", "message": "ok", "last_log_time": None},
    )
    assert "[rank 0]: done" in capsys.readouterr().out
    assert nothing_left(cluster)
    (record,) = usage.tries(run.run_dir)
    assert (record["started"], record["ended"], record["gpus"]) == (STARTED, FINISHED, 4)


def test_single_node_on_kill_and_timeout_delete_the_pod(run, cluster):
    op = launcher(run, SINGLE)
    with pytest.raises(TaskDeferred):
        op.execute(context())
    op.on_kill()  # SIGTERM arriving between the deferral and the process exit
    assert nothing_left(cluster)

    cluster.requests.clear()
    created = ("POST", "/api/v1/namespaces/trainyard-vision/pods")

    def timeout_after_creating(method, path):
        if created in cluster.requests and (method, path) != created:
            cluster.on_request = None
            raise AirflowTaskTimeout("Timeout, PID: 1")  # the next thing execute does, interrupted

    cluster.on_request = timeout_after_creating
    with pytest.raises(AirflowTaskTimeout):
        launcher(run, SINGLE, deferrable=False).execute(context())
    assert created in cluster.requests
    assert nothing_left(cluster)


def test_on_kill_before_execute_touches_nothing(run, cluster):
    launcher(run).on_kill()
    training_operator(spec=SPEC, task_id="t", run_key=RUN_KEY, config_path=run.config(SPEC), poll_interval=1).on_kill()
    assert cluster.requests == []


# -- the trigger's schedule timeout ----------------------------------------------------------------------------
def test_the_trigger_fails_pods_that_are_not_scheduled_in_time(run, cluster):
    import asyncio

    with pytest.raises(TaskDeferred) as deferred:
        launcher(run).execute(context())
    trigger = deferred.value.trigger
    trigger.schedule_timeout = 0
    api = cluster.api_client()

    trigger.__dict__["hook"] = AsyncHook(api)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first_event())
    assert event["status"] == "error" and "kubernetes.schedule_timeout_s=0s" in event["message"]
    assert "not scheduled" in event["message"]


def _first_event(trigger) -> dict:
    """The payload of the first event ``trigger`` yields (within 30 s)."""
    import asyncio

    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), 30))


def test_a_job_running_past_its_expected_hours_tells_its_team_once_and_runs_on(run, cluster, caplog):
    """The trigger ends early with ``long_training`` once the scheduled pods have run the spec's expected
    hours; the operator tells the team and defers again without it, the Job untouched; a retry that finds
    the notice given does not ask again."""
    import logging

    from trainyard_airflow.notifications import long_training_marker

    spec = {**SPEC, "resources": {**SPEC["resources"], "expected_hours": 0.0001}}  # 0.36 s
    with pytest.raises(TaskDeferred) as deferred:
        launcher(run, spec).execute(context())
    trigger = deferred.value.trigger
    assert trigger.notice_after == pytest.approx(0.36)
    assert TrainingJobTrigger(**trigger.serialize()[1]).notice_after == trigger.notice_after
    name = K.job_name(parse_spec(spec), RUN_KEY, attempt=3)
    cluster.schedule(cluster.pods_of(name), started=STARTED)
    api = cluster.api_client()

    trigger.__dict__["hook"] = AsyncHook(api)
    event = _first_event(trigger)
    assert (event["status"], event["name"], event["ran_s"]) == ("long_training", name, trigger.notice_after)

    with caplog.at_level(logging.INFO), pytest.raises(TaskDeferred) as again:
        launcher(run, spec).execute_complete(context(), event)  # a fresh instance, as after deferral
    assert "notice (long_training)" in caplog.text and long_training_marker(RUN_KEY).exists()
    assert again.value.trigger.notice_after is None and again.value.trigger.pod_names == event["pod_names"]
    assert cluster.names("jobs") == cluster.names("services") == [name]  # it trains on

    with pytest.raises(TaskDeferred) as retried:
        launcher(run, spec).execute(context(try_number=4))
    assert retried.value.trigger.notice_after is None  # said once per run


def test_a_single_node_pod_past_its_expected_hours_tells_its_team_once_and_runs_on(run, cluster, caplog):
    """The same for one bare Pod: the provider's Pod trigger, wrapped so that it ends early with
    ``long_training``; the operator tells the team and defers again to the provider's own trigger."""
    import asyncio
    import logging

    from trainyard_airflow.notifications import long_training_marker
    from trainyard_airflow.triggers.training_job import TrainingPodTrigger

    spec = {**SINGLE, "resources": {**SINGLE["resources"], "expected_hours": 0.0001}}  # 0.36 s
    with pytest.raises(TaskDeferred) as deferred:
        launcher(run, spec).execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, TrainingPodTrigger) and trigger.notice_after == pytest.approx(0.36)
    assert deferred.value.method_name == "trigger_reentry"
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("TrainingPodTrigger") and TrainingPodTrigger(**kwargs).serialize() == (classpath, kwargs)
    name = K.job_name(parse_spec(spec), RUN_KEY, attempt=3)

    async def still_running():
        await asyncio.sleep(3600)
        yield None  # never reached: an async generator that does not end

    trigger._wait_for_pod_start_within_deadline = lambda: still_running().__anext__()
    event = _first_event(trigger)
    assert (event["status"], event["name"], event["ran_s"]) == ("long_training", name, trigger.notice_after)

    with caplog.at_level(logging.INFO), pytest.raises(TaskDeferred) as again:
        launcher(run, spec).trigger_reentry(context(), event)  # a fresh instance, as after deferral
    assert "notice (long_training)" in caplog.text and long_training_marker(RUN_KEY).exists()
    assert type(again.value.trigger) is KubernetesPodTrigger and again.value.trigger.pod_name == name
    assert cluster.names("pods") == [name]  # it trains on


def test_a_training_reserves_its_team_s_budget_and_one_that_no_longer_fits_creates_nothing(run, cluster, monkeypatch):
    """Two trainings passed validation while the team's budget held one: the first reserves its worst case
    as it starts, the second fails at once naming what is left, and starts once the first has ended."""
    from pathlib import Path

    import yaml
    from airflow.sdk.exceptions import AirflowFailException

    from trainyard import paths
    from trainyard.scheduling import budgets

    fleet = yaml.safe_load((Path(__file__).parents[3] / "include/config/resources.yaml").read_text())
    price = fleet["gpu_types"]["h100-80gb"]["price_per_hour"]
    fleet["teams"]["vision"]["monthly_budget"] = price * 8 * 1.5  # one 1-hour training of 8 GPUs, not two
    config = run.home.parent / "config"
    config.mkdir()
    (config / "resources.yaml").write_text(yaml.safe_dump(fleet))
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))
    spec = {**SPEC, "resources": {**SPEC["resources"], "max_hours": 1}}

    def second() -> KubernetesTrainingLauncher:
        return KubernetesTrainingLauncher(
            task_id="train_kubernetes",
            spec=spec,
            run_key=f"{RUN_KEY}-2",
            config_path=run.config(spec, f"{RUN_KEY}-2"),
            poll_interval=0,
        )

    with pytest.raises(TaskDeferred):
        launcher(run, spec).execute(context())
    assert set(budgets.reservations(paths.runs_root())) == {RUN_KEY}
    first = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    with pytest.raises(AirflowFailException, match=r"team 'vision' has left in \d{4}-\d\d: 12\.80 of 38\.40"):
        second().execute(context())
    assert cluster.names("jobs") == [first]  # the second created nothing
    cluster.finish(cluster.pods_of(first), started=STARTED, finished=FINISHED)
    launcher(run, spec).execute_complete(context(), _event(cluster, first))
    assert budgets.reservations(paths.runs_root()) == {}  # ended: its usage counts instead
    with pytest.raises(TaskDeferred):
        second().execute(context())


def test_a_job_its_queue_suspends_waits_without_failing_and_trains_on_in_its_new_pods(run, cluster):
    """Kueue's preemption: it suspends the Job and the Job controller stops its pods (the JobSpec's grace
    to checkpoint). The trigger sees it; the operator records the pods' time so far, keeps the budget
    reservation, and waits deferred (no failure, no retry) until the Job is admitted again; then it follows
    the new pods to the Job's end."""

    from kubernetes import client

    from trainyard import paths
    from trainyard.scheduling import budgets
    from trainyard_airflow.triggers.training_job import ReadmittedJobTrigger

    with pytest.raises(TaskDeferred) as deferred:
        launcher(run).execute(context())
    name = K.job_name(SPEC_MODEL, RUN_KEY, attempt=3)
    first = cluster.pods_of(name)
    assert first[0]["spec"]["terminationGracePeriodSeconds"] == 30  # resources.yaml's preemption grace
    started = time.time() - 600  # ten minutes ago; still running as the suspension stops them
    cluster.schedule(first, started=started)
    api = cluster.api_client()

    trigger = deferred.value.trigger
    trigger.__dict__["hook"] = AsyncHook(api)
    cluster.suspend(name, "trainyard-vision")
    event = _first_event(trigger)
    assert (event["status"], event["name"]) == ("suspended", name)

    with pytest.raises(TaskDeferred) as waiting:
        launcher(run).execute_complete(context(), event)  # a fresh instance, as after deferral
    readmission = waiting.value.trigger
    assert isinstance(readmission, ReadmittedJobTrigger) and waiting.value.method_name == "execute_complete"
    assert ReadmittedJobTrigger(**readmission.serialize()[1]).serialize() == readmission.serialize()
    (record,) = usage.tries(run.run_dir)  # the time its first pods trained is counted, once
    assert record["started"] == pytest.approx(started, abs=1) and record["gpus"] == 8
    assert cluster.names("jobs") == cluster.names("services") == [name]  # nothing deleted: it trains on
    assert RUN_KEY in budgets.reservations(paths.runs_root())  # its budget stays reserved while it waits

    cluster.readmit(name, "trainyard-vision")
    again = cluster.pods_of(name)
    assert {p["metadata"]["name"] for p in again}.isdisjoint(event["pod_names"])

    async def job_pods():
        return client.CoreV1Api(api).list_namespaced_pod("trainyard-vision", label_selector=f"job-name={name}").items

    readmission.__dict__["hook"] = AsyncHook(api)
    readmission.job_pods = job_pods
    readmitted = _first_event(readmission)
    assert readmitted["status"] == "readmitted"
    assert readmitted["pod_names"] == [p["metadata"]["name"] for p in again]  # in index order
    with pytest.raises(TaskDeferred) as follows:
        launcher(run).execute_complete(context(), readmitted)
    assert isinstance(follows.value.trigger, TrainingJobTrigger)
    assert follows.value.trigger.pod_names == readmitted["pod_names"]
    # Kubernetes restarts the deadline as it resumes a Job: set to what max_hours has left after the first pods
    ran = record["ended"] - record["started"]
    deadline = cluster.objects[("jobs", "trainyard-vision", name)]["spec"]["activeDeadlineSeconds"]
    assert deadline == pytest.approx(SPEC_MODEL.resources.max_hours * 3600 - ran, abs=2)
