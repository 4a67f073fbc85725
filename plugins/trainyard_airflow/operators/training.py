"""Run a JobSpec's training on Kubernetes: the cncf.kubernetes operators, fed by the launcher seam's
Kubernetes implementation (``trainyard.training.launchers.kubernetes.KubernetesLauncher``).

- ``KubernetesTrainingJobOperator``: any number of nodes. One Indexed Job (a pod per node) plus a headless
  Service for the pods' DNS names; waits deferred in
  :class:`~trainyard_airflow.triggers.training_job.TrainingJobTrigger`.
- ``KubernetesTrainingPodOperator``: one node as a bare Pod; waits deferred in the provider's Pod trigger.

Both are built and driven by the parse-light ``trainyard_airflow.operators.launch.KubernetesTrainingLauncher``.

What execute creates is deleted on every path that does not succeed: an exception (any, also
``AirflowTaskTimeout``, a ``BaseException``), ``on_kill`` (timeout or "mark failed" while the worker runs
the task), a kill while deferred (the triggers' ``on_kill``), a deferral that times out
(``abort``, called by the launcher's ``resume_execution``). After a success the Service and the Pod are
removed and the Job is left to its TTL (``kubectl logs`` keeps working for a day). Objects are found by
their deterministic names (the run key and the try number), so a fresh operator instance, as after a
deferral, cleans up what an earlier one created.

Each try appends one usage record (``usage.jsonl`` in the run directory) from the trainer containers' start
and finish times as the API reports them, read before anything is deleted, so ``run_cost`` counts neither
the time the pods waited in a queue nor forgets a try that failed.

No retry loops: the Job has ``backoffLimit: 0`` and API errors fail the task; Airflow's retries decide,
and a retry resumes from the newest checkpoint. Errors while cleaning up are only logged (the owner
reference and the Job's TTL remove what is left) so they never hide the error that made the try fail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from kubernetes.client import models as k8s

from trainyard import paths
from trainyard.errors import PermanentError, spec_error_message
from trainyard.spec import JobSpec, SpecError, parse_spec
from trainyard.training.launchers import kubernetes as launcher
from trainyard.training.run_config import RunConfig
from trainyard_airflow.hooks.training_hook import TrainingHook
from trainyard_airflow.triggers.training_job import (
    INDEX_ANNOTATION,
    JOB_NAME_LABEL,
    ReadmittedJobTrigger,
    TrainingJobTrigger,
    TrainingPodTrigger,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
# How long a scheduled pod may take to start (the trainer image is large and pulled once per node).
IMAGE_PULL_TIMEOUT_S = 1800


def _attempt(context: Context | None) -> int:
    return context["ti"].try_number if context else 1


def _mutate(pod: k8s.V1Pod) -> k8s.V1Pod:
    """The cluster policies on ``pod`` (the provider applies them in its own builders, which these
    operators replace), then the team's policy on the pod as they left it: installed packages' policies
    run after trainyard's own hook and may have changed it."""
    from airflow.settings import pod_mutation_hook

    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import check_pod

    pod_mutation_hook(pod)
    check_pod(pod, resources_in_force())
    return pod


class _TrainingRun:
    """What both operators share: the plan from the launcher seam, names, usage and cleanup."""

    spec: Any
    run_key: str
    config_path: str
    log: Any
    kubernetes_conn_id: str | None  # the provider operator's, as its own hook takes them
    in_cluster: bool | None
    config_file: str | None
    cluster_context: str | None
    _pods: Callable[[], list[k8s.V1Pod]]  # each operator knows how its pods are found
    _try: int | None = None  # the Airflow try number, once execute or a resume method has it

    @property
    def job_spec(self) -> JobSpec:
        """``spec`` validated: the operators keep the JobSpec as the dict they were given (a template field,
        shown as JSON in the UI); the library's builders take the typed model."""
        return parse_spec(self.spec)

    def _launcher(self, context: Context | None) -> launcher.KubernetesLauncher:
        self._try = _attempt(context)
        return launcher.KubernetesLauncher(self.run_key, self._try, paths.home())

    def _plan(self, context: Context | None) -> launcher.KubernetesPlan:
        self._check_config_path()
        cfg = RunConfig.load(self.config_path)
        if cfg.data is None:  # plan_kubernetes always writes it
            raise PermanentError(f"{self.config_path} names no prepared data: plan_kubernetes did not write it")
        plan = self._launcher(context).plan
        return plan(self.job_spec, cfg.data, run_dir=self._run_dir, config_path=self.config_path)

    def _check_config_path(self) -> None:
        """``config_path`` comes from plan_kubernetes's XCom, which a user may write: it must be this run's
        own run config, or the pods would start from (and write beside) another run's."""
        from trainyard.teams import NotAllowed
        from trainyard.training.run_config import RUN_CONFIG_FILE

        own = Path(self._run_dir) / RUN_CONFIG_FILE
        if Path(self.config_path).resolve() != own.resolve():
            raise NotAllowed(
                f"config_path {self.config_path} is not run {self.run_key}'s run config ({own}): this task's "
                "input was changed; trigger the job again"
            )

    @property
    def _run_dir(self) -> str:
        """The run's directory, from the job and the run key (never from ``config_path``, an XCom's)."""
        return str(paths.run_dir(self.job_spec.name, self.run_key))

    @property
    def _namespace(self) -> str:
        return self.job_spec.kubernetes.namespace

    def _name(self) -> str:
        return launcher.job_name(self.job_spec, self.run_key, attempt=self._try or 1)

    def _reserve(self) -> None:
        """Reserve the try's worst case against its team's budget before anything is created, or fail it
        naming what the team has left (:func:`trainyard.scheduling.budgets.reserve`)."""
        from trainyard.scheduling.admission.ledger import existing_ledger
        from trainyard.scheduling.budgets import reserve
        from trainyard.scheduling.resources import resources_in_force

        fleet, spec = resources_in_force(), self.job_spec
        wait_s = spec.kubernetes.schedule_timeout_s + IMAGE_PULL_TIMEOUT_S  # before max_hours counts
        ledger = existing_ledger(fleet, read_only=False)  # a task's: an earlier version's is brought up to date
        made = reserve(fleet, paths.runs_root(), spec, self.run_key, wait_s=wait_s, ledger=ledger)
        self.log.info(
            "reserved team %s's budget for %g h x %d GPU(s) of %s", made.team, made.max_hours, made.slots, made.gpu_type
        )

    def _record_usage(self, ended: bool = True) -> None:
        """This try's usage record, once per operator instance, and, where the try ``ended``, the end of its
        budget reservation (a Job its queue suspended keeps it: it trains on once admitted again); never
        raises (it must not hide the try's own outcome)."""
        from trainyard.scheduling.budgets import release

        attempt = self._try
        if getattr(self, "_recorded", False) or attempt is None:
            return
        self._recorded = True
        try:
            pods = self._pods()
            spec = self.job_spec
            seam = launcher.KubernetesLauncher(self.run_key, attempt, paths.home())
            seam.record(spec, self._run_dir, launcher.running_interval(pods))
        except Exception as err:  # logged only: see the docstring
            self.log.warning("could not record the usage of try %s: %s", self._try, err)
            return  # its reservation stays counted until it lapses: the cost it stands for is not recorded
        if not ended:
            return
        try:
            release(paths.runs_root(), self.run_key)
        except Exception as err:  # it lapses after max_hours
            self.log.warning("could not release the budget reservation of try %s: %s", self._try, err)

    def _long_training_after(self) -> float | None:
        """Seconds this try's pods may run before the team hears that the training runs long: what is left
        of ``resources.expected_hours`` after the earlier tries; None where none is set or it was said."""
        from trainyard.training.usage import wall_seconds
        from trainyard_airflow.notifications import long_training_marker

        expected = self.job_spec.resources.expected_hours
        if expected is None or long_training_marker(self.run_key).exists():
            return None
        return max(0.0, expected * 3600 - wall_seconds(self._run_dir))

    def _tell_long_training(self, context: Context, ran_s: float) -> None:
        """The ``long_training`` notice, once per run (a failure to send it is logged: the training goes on)."""
        from trainyard.notifications import due_once
        from trainyard.training.usage import wall_seconds
        from trainyard_airflow.notifications import long_training_marker, tell_long_training

        marker = long_training_marker(self.run_key)
        try:
            if due_once(marker):
                tell_long_training(self.job_spec, self.run_key, wall_seconds(self._run_dir) + ran_s, context)
        except Exception:  # noqa: BLE001 - a notice must not stop the training
            marker.unlink(missing_ok=True)
            self.log.exception("could not tell that the training runs longer than expected")

    def abort(self, context: Context | None) -> None:
        """Record this try's usage and delete what it created (each operator knows what that is)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _aborted_on_failure(self, context: Context) -> Iterator[None]:
        """A deferral passes through (the pods run on: the next step, or the trigger's on_kill, cleans up);
        any other error aborts this try (its usage recorded, what it created deleted) and is raised again.
        (The provider's KubernetesJobOperator.execute_complete never defers; where it would, its pods would
        run on as after execute's deferral.)"""
        try:
            yield
        except TaskDeferred:
            raise
        except BaseException:
            self.abort(context)
            raise

    @cached_property
    def hook(self) -> TrainingHook:
        """The provider's hook, with the training's other objects (hooks/training_hook.py)."""
        return TrainingHook(
            conn_id=self.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
        )

    def _delete(self, kind: str, name: str) -> None:
        """Delete one object of this try; already gone is fine, any other failure is logged (see the module
        docstring)."""
        try:
            if self.hook.delete(kind, name, self._namespace):
                self.log.info("deleted %s %s", kind, name)
        except Exception as err:  # logged only: it must not replace the error that made the try fail
            self.log.warning("could not delete %s %s (its owner or TTL will): %s", kind, name, err)


class KubernetesTrainingJobOperator(_TrainingRun, KubernetesJobOperator):
    """Train a JobSpec (a dict, or an XComArg/template resolving to one) on ``resources.nodes`` pods.

    :param spec: the validated JobSpec dict; namespace, image and everything the pods need come from it.
    :param run_key: identifies the training run (e.g. ``"<dag_id>/<run_id>"``); with the spec's name it
        makes the labels and the object names.
    :param config_path: the run's RunConfig JSON on this worker (under TRAINYARD_HOME, the shared volume).
    """

    template_fields: Sequence[str] = (*KubernetesJobOperator.template_fields, "spec", "run_key", "config_path")
    template_fields_renderers = {**KubernetesJobOperator.template_fields_renderers, "spec": "json"}

    def __init__(self, *, spec: dict | Any, run_key: str, config_path: str, **kwargs) -> None:
        super().__init__(
            completion_mode="Indexed",
            backoff_limit=0,
            wait_until_job_complete=True,  # also the only mode in which the provider fetches logs
            get_logs=True,
            do_xcom_push=False,  # results travel through the run directory, not an xcom sidecar
            base_container_name=launcher.CONTAINER,
            # The pods go with their Job; this operator reads their state and logs before deleting it.
            on_finish_action="keep_pod",
            on_kill_propagation_policy="Background",
            **kwargs,
        )
        self.spec = spec
        self.run_key = run_key
        self.config_path = config_path

    def build_job_request_obj(self, context: Context | None = None) -> k8s.V1Job:
        objects: tuple[Any, ...] = self._plan(context).objects
        service, job = objects
        self._service = service
        template = job.spec.template
        pod = _mutate(
            k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(
                    name=job.metadata.name,
                    namespace=job.metadata.namespace,
                    labels={**template.metadata.labels, **self._get_ti_pod_labels(context)},
                ),
                spec=template.spec,
            )
        )
        job.spec.template = k8s.V1PodTemplateSpec(
            metadata=k8s.V1ObjectMeta(labels=pod.metadata.labels, annotations=pod.metadata.annotations),
            spec=pod.spec,
        )
        # The provider's pod discovery reads these.
        self.pod_request_obj = pod
        self.namespace = job.metadata.namespace
        self.labels = launcher.run_labels(self.job_spec, self.run_key)
        self.parallelism = self.completions = job.spec.parallelism
        return job

    def execute(self, context: Context):
        self.parallelism = self.job_spec.resources.nodes  # checked before the Job is built
        self._try = _attempt(context)
        self._remove_earlier_attempts()
        with self._aborted_on_failure(context):
            self._reserve()
            result = super().execute(context)
        self._finish()
        return result

    def execute_deferrable(self) -> None:
        job = self.job
        if job is None:  # the provider defers only after create_job set it
            raise AirflowException("no Job to wait for")
        pods = [pod.metadata.name for pod in self.pods]
        self._defer(job.metadata.name, job.metadata.namespace, pods, notice_after=self._long_training_after())

    def _defer(self, name: str, namespace: str, pods: list[str], notice_after: float | None) -> None:
        self.defer(
            trigger=TrainingJobTrigger(
                job_name=name,
                job_namespace=namespace,
                pod_names=pods,
                pod_namespace=namespace,
                base_container_name=self.base_container_name,
                kubernetes_conn_id=self.kubernetes_conn_id,
                cluster_context=self.cluster_context,
                config_file=self.config_file,
                in_cluster=self.in_cluster,
                poll_interval=self.job_poll_interval,
                get_logs=self.get_logs,
                do_xcom_push=False,
                schedule_timeout=self.schedule_timeout_seconds,
                service_name=name,
                notice_after=notice_after,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict, **kwargs):
        self._try = _attempt(context)
        if event.get("status") == "long_training":  # the Job runs on: tell the team, wait again
            self._tell_long_training(context, float(event.get("ran_s") or 0.0))
            self._defer(event["name"], event["namespace"], list(event["pod_names"]), notice_after=None)
        if event.get("status") == "suspended":  # preempted by its queue: wait for it to be admitted again
            self._wait_readmitted(event)
        if event.get("status") == "readmitted":  # its pods anew: the training resumes from its checkpoint
            with self._aborted_on_failure(context):  # max_hours used up meanwhile: the Job goes, the try fails
                self._readmitted(event)
                pods = list(event["pod_names"])
                self._defer(event["name"], event["namespace"], pods, notice_after=self._long_training_after())
        with self._aborted_on_failure(context):
            result = super().execute_complete(context, event, **kwargs)
        self._finish()
        return result

    def _wait_readmitted(self, event: dict) -> None:
        """A Job its queue suspended (Kueue's preemption): its pods are being stopped, with the grace the
        JobSpec gives them to checkpoint. Their time so far is recorded; the task waits deferred, without
        failing or using a retry, until the Job is admitted again and has its pods anew."""
        from trainyard.scheduling.resources import resources_in_force

        self.log.warning(
            "Job %s was suspended by its queue (a preemption): its pods have %ds to checkpoint and end; the "
            "task waits for the queue to admit the Job again, and the training resumes from its checkpoint",
            event["name"],
            launcher.termination_grace(self.job_spec, resources_in_force()),
        )
        self._record_usage(ended=False)
        self.defer(
            trigger=ReadmittedJobTrigger(
                job_name=event["name"],
                job_namespace=event["namespace"],
                parallelism=self.job_spec.resources.nodes,
                stopped=list(event["pod_names"]),
                timeout=self.schedule_timeout_seconds,
                poll_interval=self.job_poll_interval,
                kubernetes_conn_id=self.kubernetes_conn_id,
                cluster_context=self.cluster_context,
                config_file=self.config_file,
                in_cluster=self.in_cluster,
            ),
            method_name="execute_complete",
        )

    def _readmitted(self, event: dict) -> None:
        """The Job admitted again: Kubernetes restarts its ``activeDeadlineSeconds`` on resuming, so it is
        set to what is left of ``resources.max_hours`` after the time already trained; the budget
        reservation is renewed for the rest (one the budget no longer covers is logged: the queue admitted
        the Job, and its spend is counted as it trains)."""
        from trainyard.training.launchers.base import time_left

        name = event["name"]
        left = max(1, int(time_left(self.job_spec, self._run_dir)))  # MaxHoursReached where none is
        self.log.info(
            "Job %s was admitted again; its pods %s resume the training (%ds left)", name, event["pod_names"], left
        )
        try:
            self.hook.patch_namespaced_job(name, event["namespace"], {"spec": {"activeDeadlineSeconds": left}})
            self._reserve()
        except Exception as err:  # noqa: BLE001 - the training goes on; its usage is recorded when it ends
            self.log.warning("Job %s: could not renew its deadline or its budget reservation: %s", name, err)

    def on_kill(self) -> None:
        self.abort(None)

    def abort(self, context: Context | None) -> None:
        """Record this try's usage, then delete its Job (and so its pods) and its Service."""
        if self._try is None:
            if context is None:
                return  # killed before execute began: nothing was created
            self._try = _attempt(context)
        self._record_usage()
        self._delete("Job", self._name())
        self._delete("Service", self._name())

    def _finish(self) -> None:
        self._record_usage()
        self._delete("Service", self._name())

    def _pods(self) -> list[k8s.V1Pod]:
        return self.hook.list_pods(self._namespace, f"{JOB_NAME_LABEL}={self._name()}")

    def create_job(self, job_request_obj: k8s.V1Job) -> k8s.V1Job:
        job = self.hook.create_job(job=job_request_obj)
        service = self._service
        service.metadata.owner_references = [
            k8s.V1OwnerReference(api_version="batch/v1", kind="Job", name=job.metadata.name, uid=job.metadata.uid)
        ]
        # Created after the Job (the owner needs a uid): pod 0 hosts the rendezvous without DNS and the
        # other pods retry the lookup, so the pods may start first.
        self.hook.create_service(service, job.metadata.namespace)
        self.log.info(
            "created Job %s and headless Service %s in %s",
            job.metadata.name,
            service.metadata.name,
            job.metadata.namespace,
        )
        return job

    def get_pods(
        self, pod_request_obj: k8s.V1Pod, context: Context, *, exclude_checked: bool = True
    ) -> Sequence[k8s.V1Pod]:
        """Every pod of the Job: the provider lists a few times without pausing and would otherwise watch
        only the pods it saw. Waits up to ``startup_timeout_seconds`` for the Job controller to create
        them (a queue that suspends Jobs, such as Kueue, is waited for here, before deferring)."""
        selector = (
            self._build_find_pod_label_selector(context, exclude_checked=exclude_checked)
            + f",{JOB_NAME_LABEL}={pod_request_obj.metadata.name}"
        )
        deadline = time.monotonic() + self.startup_timeout_seconds
        while True:
            pods = self.hook.list_pods(pod_request_obj.metadata.namespace, selector)
            if len(pods) >= self.parallelism or time.monotonic() >= deadline:
                break
            time.sleep(self.startup_check_interval_seconds)
        if len(pods) < self.parallelism:
            raise AirflowException(
                f"the Job controller created {len(pods)} of {self.parallelism} pods (labels {selector}) within "
                f"{self.startup_timeout_seconds}s; see `kubectl describe job {pod_request_obj.metadata.name}` "
                "(quota, admission webhook?)"
            )
        pods = sorted(pods, key=lambda p: int((p.metadata.annotations or {}).get(INDEX_ANNOTATION, 0)))
        for pod in pods:
            self.log_matching_pod(pod=pod, context=context)
        return pods

    def _remove_earlier_attempts(self) -> None:
        """Two trainings writing one run directory would corrupt its checkpoints: Jobs an earlier try of
        this run left (found by the run's labels, never by name) are deleted first."""
        selector = ",".join(f"{k}={v}" for k, v in launcher.run_labels(self.job_spec, self.run_key).items())
        ours = self._name()
        for job in self.hook.list_jobs(self._namespace, selector):
            if job.metadata.name != ours:
                self.log.warning("deleting Job %s, left by an earlier try of this run", job.metadata.name)
                self._delete("Job", job.metadata.name)


class KubernetesTrainingPodOperator(_TrainingRun, KubernetesPodOperator):
    """Train a single-node JobSpec in one Pod (same container as a Job's pod, no Service needed)."""

    template_fields: Sequence[str] = (*KubernetesPodOperator.template_fields, "spec", "run_key", "config_path")
    template_fields_renderers = {**KubernetesPodOperator.template_fields_renderers, "spec": "json"}

    def __init__(self, *, spec: dict | Any, run_key: str, config_path: str, **kwargs) -> None:
        super().__init__(
            get_logs=True,
            do_xcom_push=False,
            base_container_name=launcher.CONTAINER,
            on_finish_action="delete_pod",
            **kwargs,
        )
        self.spec = spec
        self.run_key = run_key
        self.config_path = config_path

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        objects = self._plan(context).objects
        if len(objects) != 1:
            raise SpecError(
                spec_error_message(
                    [
                        f"resources.nodes: a single pod runs one node, got "
                        f"{self.job_spec.resources.nodes} (use the Job operator)"
                    ]
                )
            )
        (pod,) = objects
        pod.metadata.labels = {**pod.metadata.labels, **self._get_ti_pod_labels(context)}
        # find_pod (reattach after a worker crash) selects by these plus the task-instance labels.
        self.labels = launcher.run_labels(self.job_spec, self.run_key)
        self.namespace = pod.metadata.namespace
        return _mutate(pod)

    def execute(self, context: Context):
        self._try = _attempt(context)
        with self._aborted_on_failure(context):
            self._reserve()
            return super().execute(context)

    def invoke_defer_method(self, last_log_time: Any = None, context: Context | None = None) -> None:
        """The provider's deferral, to :class:`TrainingPodTrigger` where the team is still to hear that the
        training runs long (``resources.expected_hours``)."""
        try:
            super().invoke_defer_method(last_log_time=last_log_time, context=context)
        except TaskDeferred as deferred:
            notice_after = self._long_training_after()
            if notice_after is None or not isinstance(deferred.trigger, KubernetesPodTrigger):
                raise
            _, kwargs = deferred.trigger.serialize()
            raise TaskDeferred(
                trigger=TrainingPodTrigger(**kwargs, notice_after=notice_after),
                method_name=deferred.method_name,
                kwargs=deferred.kwargs,
                timeout=deferred.timeout,
            ) from None

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        self._try = _attempt(context)
        if event.get("status") == "long_training":  # the pod runs on: tell the team, wait again
            self._tell_long_training(context, float(event.get("ran_s") or 0.0))
            self.pod = self.hook.get_pod(event["name"], event["namespace"])
            self.invoke_defer_method(last_log_time=event.get("last_log_time"), context=context)
        with self._aborted_on_failure(context):  # a re-deferral (periodic logs, a trigger error) passes
            return super().trigger_reentry(context, event)

    def cleanup(
        self, pod: k8s.V1Pod, remote_pod: k8s.V1Pod, xcom_result: dict | None = None, context: Context | None = None
    ) -> None:
        # The provider's last look at the pod before on_finish_action deletes it: record from it.
        self._final_pod = remote_pod
        self._record_usage()
        super().cleanup(pod=pod, remote_pod=remote_pod, xcom_result=xcom_result, context=context)

    def on_kill(self) -> None:
        self.abort(None)

    def abort(self, context: Context | None) -> None:
        """Record this try's usage, then delete its Pod."""
        if self._try is None:
            if context is None:
                return
            self._try = _attempt(context)
        self._record_usage()
        self._delete("Pod", self._name())

    def _pods(self) -> list[k8s.V1Pod]:
        final = getattr(self, "_final_pod", None)
        if final is not None:
            return [final]
        pod = self.hook.read_pod(self._name(), self._namespace)
        return [pod] if pod is not None else []


def training_operator(
    *, spec: dict | Any, poll_interval: float, **kwargs: Any
) -> KubernetesTrainingJobOperator | KubernetesTrainingPodOperator:
    """The operator for a spec: a bare Pod for one node, an Indexed Job and its Service for more, with
    ``kubernetes.schedule_timeout_s`` as the time the pods may wait to be scheduled."""
    s = parse_spec(spec)
    common: dict[str, Any] = dict(
        spec=spec, namespace=s.kubernetes.namespace, schedule_timeout_seconds=s.kubernetes.schedule_timeout_s
    )
    if s.resources.nodes == 1:
        return KubernetesTrainingPodOperator(
            **common, startup_timeout_seconds=IMAGE_PULL_TIMEOUT_S, poll_interval=poll_interval, **kwargs
        )
    # The Job operator's startup timeout is its wait for the Job controller's pods (see get_pods).
    return KubernetesTrainingJobOperator(
        **common, startup_timeout_seconds=s.kubernetes.schedule_timeout_s, job_poll_interval=poll_interval, **kwargs
    )
