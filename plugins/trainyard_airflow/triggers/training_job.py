"""The provider's ``KubernetesJobTrigger`` plus the two things a training Job needs from it:

- a schedule timeout: the pods may wait to be scheduled (a cluster queue, quota, scale-up) at most
  ``schedule_timeout`` seconds (``kubernetes.schedule_timeout_s``), then the try fails; the provider's
  Job trigger would wait for ever. Pulling the image and running are not limited here (the task's
  ``execution_timeout`` is).
- ``on_kill``: a user's "mark failed" / "clear" while the task is deferred deletes the Job (its pods go
  with it) and its Service. The provider's Pod trigger does this for a Pod; its Job trigger does not.
- a word when the training runs long: with ``notice_after``, once the pods are scheduled and have run that
  many seconds without the Job ending, the trigger ends with a ``long_training`` event; the operator tells
  the team and defers again to a trigger without it (the Job runs on meanwhile). A single-node training's
  bare Pod gets the same from :class:`TrainingPodTrigger`.
- a preemption by Kueue: Kueue suspends the Job (``spec.suspend``) and the Job controller stops its pods
  (SIGTERM, then SIGKILL after the pods' grace; the workers checkpoint in it). The trigger ends with a
  ``suspended`` event; the operator defers to :class:`ReadmittedJobTrigger`, which waits until Kueue admits
  the Job again and its pods are made anew, and then to this trigger again, for them.

Everything else (waiting for the Job, the event the operator resumes with) is the provider's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.triggers.base import BaseTrigger, TriggerEvent
from kubernetes_asyncio import client as async_client

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the Job controller's label on its pods
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def unscheduled(pods: list[Any]) -> list[str]:
    """Names of the pods the scheduler has not placed yet (no ``PodScheduled=True`` condition)."""
    out = []
    for pod in pods:
        conditions = (pod.status.conditions if pod.status else None) or []
        if not any(c.type == "PodScheduled" and c.status == "True" for c in conditions):
            out.append(pod.metadata.name)
    return out


async def first_event_or_none(
    events: AsyncIterator[TriggerEvent],
    within: float | None,
    otherwise: Coroutine[Any, Any, TriggerEvent] | None = None,
) -> TriggerEvent | None:
    """The first event ``events`` yields, or the event ``otherwise`` ends with if it ends first, or None if
    ``within`` seconds pass first (what is still waiting is then cancelled); ``within`` None: wait for one
    of them however long."""
    first = asyncio.ensure_future(anext(events.__aiter__()))
    waiting = {first} if otherwise is None else {first, asyncio.ensure_future(otherwise)}
    try:
        done, _ = await asyncio.wait(
            waiting, timeout=None if within is None else max(0.0, within), return_when=asyncio.FIRST_COMPLETED
        )
    finally:  # also when this trigger is cancelled itself: nothing of it polls on in the triggerer
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    if not done:
        return None
    return first.result() if first in done else done.pop().result()  # the Job's own end comes first


class TrainingJobTrigger(KubernetesJobTrigger):
    def __init__(
        self,
        *,
        schedule_timeout: float,
        service_name: str | None = None,
        notice_after: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.schedule_timeout = schedule_timeout
        self.service_name = service_name
        self.notice_after = notice_after
        self._fired = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return (
            f"{__name__}.{type(self).__name__}",
            {
                **kwargs,
                "schedule_timeout": self.schedule_timeout,
                "service_name": self.service_name,
                "notice_after": self.notice_after,
            },
        )

    def _event(self, status: str, message: str | None = None, **more: Any) -> TriggerEvent:
        return TriggerEvent(
            {
                "name": self.job_name,
                "namespace": self.job_namespace,
                "status": status,
                "pod_names": list(self.pod_names),
                "pod_namespace": self.pod_namespace,
                "job": None,
                "xcom_result": None,
                "message": message,
                **more,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.schedule_timeout
        while waiting := await self._unscheduled():
            if await self._suspended():  # preempted before its pods were placed (their deletion, a 404)
                self._fired = True
                yield self._event("suspended", f"Job {self.job_name} was suspended (a preemption by its queue)")
                return
            if time.monotonic() >= deadline:
                self._fired = True
                yield self._event(
                    "error",
                    f"pods {waiting} were not scheduled within kubernetes.schedule_timeout_s="
                    f"{self.schedule_timeout:g}s (a cluster queue, quota or no node with the GPUs?); "
                    f"see `kubectl describe pod -n {self.pod_namespace} {waiting[0]}`",
                )
                return
            await asyncio.sleep(self.poll_interval)
        event = await first_event_or_none(super().run(), self.notice_after, self._suspension())
        self._fired = True
        if event is None:  # still running: the operator tells the team, then waits again without this
            yield self._event("long_training", ran_s=self.notice_after)
            return
        yield event

    async def _unscheduled(self) -> list[str]:
        """:func:`unscheduled` of the pods; one gone (a suspension deleted it) counts as not placed."""
        pods = []
        for name in self.pod_names:
            try:
                pods.append(await self.hook.get_pod(name=name, namespace=self.pod_namespace))
            except async_client.ApiException as err:
                if err.status != 404:
                    raise
                return [name]
        return unscheduled(pods)

    async def _suspended(self) -> bool:
        job = await self.hook.get_job_status(name=self.job_name, namespace=self.job_namespace)
        return job.spec is not None and bool(job.spec.suspend)

    async def _suspension(self) -> TriggerEvent:
        """The event once the Job is suspended: Kueue preempted it, and its pods are being stopped. An API
        error is looked at again at the next poll (the provider's own wait fails the try on one)."""
        while True:
            try:
                if await self._suspended():
                    return self._event("suspended", f"Job {self.job_name} was suspended (a preemption by its queue)")
            except Exception as err:  # noqa: BLE001 - retried: a transient error must not end the training's watch
                self.log.warning("could not read Job %s (%s); looking again", self.job_name, err)
            await asyncio.sleep(self.poll_interval)

    async def on_kill(self) -> None:
        if self._fired:  # the operator resumes and cleans up itself
            return
        await delete_training_job(self.hook, self.job_name, self.job_namespace, self.service_name)


async def delete_training_job(hook: Any, name: str, namespace: str, service: str | None) -> None:
    """Delete a training's Job (its pods go with it) and its headless Service; one already gone is fine."""
    async with hook.get_conn() as connection:
        try:
            await async_client.BatchV1Api(connection).delete_namespaced_job(
                name=name, namespace=namespace, propagation_policy="Background"
            )
        except async_client.ApiException as err:
            if err.status != 404:
                raise
        if service:
            try:
                await async_client.CoreV1Api(connection).delete_namespaced_service(name=service, namespace=namespace)
            except async_client.ApiException as err:
                if err.status != 404:
                    raise


class ReadmittedJobTrigger(BaseTrigger):
    """A training Job that its queue (Kueue) suspended, waited for until it is admitted again (``spec.suspend``
    false) and the Job controller has made its ``parallelism`` pods anew (none of ``stopped``, the pods it
    stopped); ends with ``readmitted`` and their names, in index order. Past ``timeout`` seconds
    (``kubernetes.schedule_timeout_s``) it ends with ``error``, and the try fails. Killed while it waits
    ("mark failed", a clear), it deletes the Job and its Service: readmitted later, nobody would watch it."""

    def __init__(
        self,
        *,
        job_name: str,
        job_namespace: str,
        parallelism: int,
        stopped: list[str],
        timeout: float,
        poll_interval: float = 10.0,
        kubernetes_conn_id: str | None = None,
        cluster_context: str | None = None,
        config_file: str | None = None,
        in_cluster: bool | None = None,
    ) -> None:
        super().__init__()
        self.job_name, self.job_namespace, self.parallelism = job_name, job_namespace, parallelism
        self.stopped, self.timeout, self.poll_interval = list(stopped), timeout, poll_interval
        self.kubernetes_conn_id, self.cluster_context = kubernetes_conn_id, cluster_context
        self.config_file, self.in_cluster = config_file, in_cluster
        self._fired = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{__name__}.{type(self).__name__}",
            {
                "job_name": self.job_name,
                "job_namespace": self.job_namespace,
                "parallelism": self.parallelism,
                "stopped": self.stopped,
                "timeout": self.timeout,
                "poll_interval": self.poll_interval,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "cluster_context": self.cluster_context,
                "config_file": self.config_file,
                "in_cluster": self.in_cluster,
            },
        )

    @cached_property
    def hook(self) -> AsyncKubernetesHook:
        return AsyncKubernetesHook(
            conn_id=self.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
        )

    async def job_pods(self) -> list[Any]:
        """The Job's pods as the API lists them (by the Job controller's label)."""
        async with self.hook.get_conn() as connection:
            listed = await async_client.CoreV1Api(connection).list_namespaced_pod(
                self.job_namespace, label_selector=f"{JOB_NAME_LABEL}={self.job_name}"
            )
        return list(listed.items)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        event = {"name": self.job_name, "namespace": self.job_namespace}
        while time.monotonic() < deadline:
            job = await self.hook.get_job_status(name=self.job_name, namespace=self.job_namespace)
            if job.spec is not None and not job.spec.suspend:
                pods = [p for p in await self.job_pods() if p.metadata.name not in self.stopped]
                if len(pods) >= self.parallelism:
                    pods.sort(key=lambda p: int((p.metadata.annotations or {}).get(INDEX_ANNOTATION, 0)))
                    self._fired = True
                    yield TriggerEvent({**event, "status": "readmitted", "pod_names": [p.metadata.name for p in pods]})
                    return
            await asyncio.sleep(self.poll_interval)
        message = (
            f"Job {self.job_name}, suspended by its queue, was not admitted again within "
            f"kubernetes.schedule_timeout_s={self.timeout:g}s; see `kubectl describe job -n {self.job_namespace} "
            f"{self.job_name}`"
        )
        self._fired = True
        yield TriggerEvent({**event, "status": "error", "message": message, "pod_names": []})

    async def on_kill(self) -> None:
        if self._fired:  # the operator resumes and cleans up itself
            return
        await delete_training_job(self.hook, self.job_name, self.job_namespace, self.job_name)


class TrainingPodTrigger(KubernetesPodTrigger):
    """The provider's Pod trigger for a single-node training, plus the ``long_training`` word: with
    ``notice_after``, once that many seconds have passed since the trigger started without the pod
    ending, it ends with a ``long_training`` event (the pod keeps running; the operator tells the team and
    defers again to the provider's own trigger)."""

    def __init__(self, *, notice_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.notice_after = notice_after

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{__name__}.{type(self).__name__}", {**kwargs, "notice_after": self.notice_after}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await first_event_or_none(super().run(), self.notice_after)
        self._fired_event = True  # either way the operator resumes: a kill from here on is its to handle
        if event is None:
            yield TriggerEvent(
                {
                    "status": "long_training",
                    "namespace": self.pod_namespace,
                    "name": self.pod_name,
                    "message": f"still running after {self.notice_after:g}s",
                    "ran_s": self.notice_after,
                    "last_log_time": self.last_log_time,
                }
            )
            return
        yield event
