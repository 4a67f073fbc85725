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

Everything else (waiting for the Job, the event the operator resumes with) is the provider's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.triggers.base import TriggerEvent
from kubernetes_asyncio import client as async_client


def unscheduled(pods: list[Any]) -> list[str]:
    """Names of the pods the scheduler has not placed yet (no ``PodScheduled=True`` condition)."""
    out = []
    for pod in pods:
        conditions = (pod.status.conditions if pod.status else None) or []
        if not any(c.type == "PodScheduled" and c.status == "True" for c in conditions):
            out.append(pod.metadata.name)
    return out


async def first_event_or_none(events: AsyncIterator[TriggerEvent], within: float | None) -> TriggerEvent | None:
    """The first event ``events`` yields, or None if ``within`` seconds pass first (the watch is then
    cancelled); ``within`` None: wait for it however long."""
    watch = events.__aiter__()
    if within is None:
        return await anext(watch)
    first = asyncio.ensure_future(anext(watch))
    done, _ = await asyncio.wait({first}, timeout=max(0.0, within))
    if done:
        return first.result()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    return None


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
        while waiting := unscheduled(
            [await self.hook.get_pod(name=n, namespace=self.pod_namespace) for n in self.pod_names]
        ):
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
        event = await first_event_or_none(super().run(), self.notice_after)
        self._fired = True
        if event is None:  # still running: the operator tells the team, then waits again without this
            yield self._event("long_training", ran_s=self.notice_after)
            return
        yield event

    async def on_kill(self) -> None:
        if self._fired:  # the operator resumes and cleans up itself
            return
        async with self.hook.get_conn() as connection:
            try:
                await async_client.BatchV1Api(connection).delete_namespaced_job(
                    name=self.job_name, namespace=self.job_namespace, propagation_policy="Background"
                )
            except async_client.ApiException as err:
                if err.status != 404:
                    raise
            if self.service_name:
                try:
                    await async_client.CoreV1Api(connection).delete_namespaced_service(
                        name=self.service_name, namespace=self.job_namespace
                    )
                except async_client.ApiException as err:
                    if err.status != 404:
                        raise


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
