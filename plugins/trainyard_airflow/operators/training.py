"""Run a JobSpec's training on Kubernetes: the cncf.kubernetes operators, fed by the pure builders of
``trainyard.training.launchers.kubernetes``.

- ``KubernetesTrainingJobOperator``: any number of nodes. One Indexed Job (a pod per node) plus a headless
  Service for the pods' DNS names. It waits for the Job, then writes every pod's log into the task log.
- ``KubernetesTrainingPodOperator``: one node as a bare Pod, with the provider's reattach-after-worker-crash.

What these override in the provider, and why:

- ``build_job_request_obj`` / ``build_pod_request_obj`` return the launcher's objects instead of assembling
  them from operator arguments (the spec is the single source of truth), adding the provider's
  task-instance labels (it finds the pods by them) and applying the cluster's ``pod_mutation_hook``.
- ``create_job`` also creates the Service, owned by the Job, so the cluster removes it with the Job even
  if this worker dies; ``execute``/``execute_complete`` delete it after the logs are read.
- ``get_pods`` waits (up to ``startup_timeout_seconds``) until the Job controller has created every pod:
  the provider lists a few times without pausing and would otherwise read the logs of only the pods it
  saw. Pods of an earlier try are told apart by the Job's own ``batch.kubernetes.io/job-name`` label.
- ``execute`` deletes Jobs an earlier try of the same run left running (found by labels, never by name):
  two trainings writing one run directory would corrupt its checkpoints.

No retry loops: the Job has ``backoffLimit: 0`` and API errors fail the task; Airflow's retries decide,
and a retry resumes from the newest checkpoint. Errors while cleaning up after a finished training are
only logged (the owner reference and the Job's TTL remove what is left) so a transient error there does
not make Airflow repeat hours of training.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException

from trainyard.training.launchers import kubernetes as launcher

if TYPE_CHECKING:
    from airflow.sdk import Context

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def _attempt(context: Context | None) -> int:
    return context["ti"].try_number if context else 1


def _mutate(pod: k8s.V1Pod) -> k8s.V1Pod:
    # The provider applies the cluster policy in its own builders, which these operators replace.
    from airflow.settings import pod_mutation_hook

    pod_mutation_hook(pod)
    return pod


class KubernetesTrainingJobOperator(KubernetesJobOperator):
    """Train a JobSpec (a dict, or an XComArg/template resolving to one) on ``resources.nodes`` pods.

    :param spec: the validated JobSpec dict; namespace, image and everything the pods need come from it.
    :param run_key: identifies the training run (e.g. ``"<dag_id>/<run_id>"``); with the spec's name it
        makes the labels and the object names.
    :param config_path: the run's RunConfig JSON as the pods see it (under ``/var/trainyard``).
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
            **kwargs,
        )
        self.spec = spec
        self.run_key = run_key
        self.config_path = config_path

    def build_job_request_obj(self, context: Context | None = None) -> k8s.V1Job:
        self._attempt = _attempt(context)
        job = launcher.build_job(self.spec, self.run_key, self.config_path, attempt=self._attempt)
        template = job.spec.template
        pod = _mutate(k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=job.metadata.name, namespace=job.metadata.namespace,
                                      labels={**template.metadata.labels, **self._get_ti_pod_labels(context)}),
            spec=template.spec,
        ))
        job.spec.template = k8s.V1PodTemplateSpec(
            metadata=k8s.V1ObjectMeta(labels=pod.metadata.labels, annotations=pod.metadata.annotations),
            spec=pod.spec,
        )
        # The provider's pod discovery reads these.
        self.pod_request_obj = pod
        self.namespace = job.metadata.namespace
        self.labels = launcher.run_labels(self.spec, self.run_key)
        self.parallelism = self.completions = job.spec.parallelism
        return job

    def execute(self, context: Context):
        self.parallelism = launcher.as_spec(self.spec).resources.nodes  # checked before the Job is built
        self._remove_earlier_attempts(context)
        deferred = False
        try:
            return super().execute(context)
        except TaskDeferred:
            deferred = True  # the pods still run; execute_complete cleans up
            raise
        except Exception:
            self._delete_job()
            raise
        finally:
            if not deferred:
                self._delete_service(context)

    def execute_complete(self, context: Context, event: dict, **kwargs):
        try:
            return super().execute_complete(context, event, **kwargs)
        finally:
            self._delete_service(context)

    def create_job(self, job_request_obj: k8s.V1Job) -> k8s.V1Job:
        job = self.hook.create_job(job=job_request_obj)
        service = launcher.build_service(self.spec, self.run_key, attempt=self._attempt)
        service.metadata.owner_references = [k8s.V1OwnerReference(
            api_version="batch/v1", kind="Job", name=job.metadata.name, uid=job.metadata.uid)]
        # Created after the Job (the owner needs a uid): pod 0 hosts the rendezvous without DNS and the
        # other pods retry the lookup, so the pods may start first.
        self.client.create_namespaced_service(namespace=job.metadata.namespace, body=service)
        self.log.info("created Job %s and headless Service %s in %s", job.metadata.name,
                      service.metadata.name, job.metadata.namespace)
        return job

    def get_pods(self, pod_request_obj: k8s.V1Pod, context: Context, *, exclude_checked: bool = True
                 ) -> Sequence[k8s.V1Pod]:
        selector = (self._build_find_pod_label_selector(context, exclude_checked=exclude_checked)
                    + f",batch.kubernetes.io/job-name={pod_request_obj.metadata.name}")
        deadline = time.monotonic() + self.startup_timeout_seconds
        while True:
            pods = self.client.list_namespaced_pod(
                namespace=pod_request_obj.metadata.namespace, label_selector=selector).items
            if len(pods) >= self.parallelism or time.monotonic() >= deadline:
                break
            time.sleep(self.startup_check_interval_seconds)
        if len(pods) < self.parallelism:
            raise AirflowException(
                f"the Job controller created {len(pods)} of {self.parallelism} pods (labels {selector}) within "
                f"{self.startup_timeout_seconds}s; see `kubectl describe job {pod_request_obj.metadata.name}` "
                "(quota, admission webhook?)")
        pods = sorted(pods, key=lambda p: int((p.metadata.annotations or {}).get(INDEX_ANNOTATION, 0)))
        for pod in pods:
            self.log_matching_pod(pod=pod, context=context)
        return pods

    def _run_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in launcher.run_labels(self.spec, self.run_key).items())

    def _remove_earlier_attempts(self, context: Context) -> None:
        namespace = launcher.as_spec(self.spec).kubernetes.namespace
        ours = launcher.job_name(self.spec, self.run_key, attempt=_attempt(context))
        for job in self.job_client.list_namespaced_job(namespace=namespace, label_selector=self._run_selector()).items:
            if job.metadata.name != ours:
                self.log.warning("deleting Job %s, left by an earlier try of this run", job.metadata.name)
                self.job_client.delete_namespaced_job(name=job.metadata.name, namespace=namespace,
                                                      propagation_policy="Background")

    def _delete_job(self) -> None:
        if self.job is None:
            return
        try:
            self.job_client.delete_namespaced_job(name=self.job.metadata.name, namespace=self.job.metadata.namespace,
                                                  propagation_policy="Background")
        except ApiException as err:
            if err.status != 404:
                self.log.warning("could not delete Job %s (its TTL will): %s", self.job.metadata.name, err)

    def _delete_service(self, context: Context) -> None:
        spec = launcher.as_spec(self.spec)
        name = launcher.job_name(spec, self.run_key, attempt=_attempt(context))
        try:
            self.client.delete_namespaced_service(name=name, namespace=spec.kubernetes.namespace)
            self.log.info("deleted Service %s", name)
        except ApiException as err:
            if err.status != 404:
                self.log.warning("could not delete Service %s (it goes with its Job): %s", name, err)


class KubernetesTrainingPodOperator(KubernetesPodOperator):
    """Train a single-node JobSpec in one Pod (same container as a Job's pod, no Service needed)."""

    template_fields: Sequence[str] = (*KubernetesPodOperator.template_fields, "spec", "run_key", "config_path")
    template_fields_renderers = {**KubernetesPodOperator.template_fields_renderers, "spec": "json"}

    def __init__(self, *, spec: dict | Any, run_key: str, config_path: str, **kwargs) -> None:
        super().__init__(get_logs=True, do_xcom_push=False, base_container_name=launcher.CONTAINER, **kwargs)
        self.spec = spec
        self.run_key = run_key
        self.config_path = config_path

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        pod = launcher.build_pod(self.spec, self.run_key, self.config_path, attempt=_attempt(context))
        pod.metadata.labels = {**pod.metadata.labels, **self._get_ti_pod_labels(context)}
        # find_pod (reattach after a worker crash) selects by these plus the task-instance labels.
        self.labels = launcher.run_labels(self.spec, self.run_key)
        self.namespace = pod.metadata.namespace
        return _mutate(pod)
