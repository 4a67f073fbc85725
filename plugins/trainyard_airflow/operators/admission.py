"""``AdmitOperator``: a job's GPUs from the admission ledger before its training task starts.

One look on the worker; a job admitted at once (the usual case on an idle fleet, and every CPU job of
the default team) is done there. Otherwise the task defers to
:class:`trainyard_airflow.triggers.admission.AdmissionTrigger`, which looks again from the triggerer and
ends the task itself once the job is admitted: waiting jobs hold no worker and start no task process,
where a reschedule-mode sensor started one per look. The task's XCom is the verdict's message ("admitted:
4 a100-80gb slot(s) for team vision, 2 of them borrowed").

A job waits at most ``ADMISSION_TIMEOUT_S`` (the deferral's timeout); then its run fails, without a
retry (another week of waiting is not what a retry is for), and its row in the ledger runs out with its
lease. A job still waiting after ``scheduling.queue_wait_notice_minutes`` resumes on a worker once, to tell
its team (notice ``queue_wait``), and defers again for what is left of its wait.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from airflow.sdk import BaseOperator

from trainyard.errors import PermanentError
from trainyard.scheduling.admission.ledger import ADMISSION_TIMEOUT_S
from trainyard_airflow.errors import fail_permanently

ADMISSION_TIMEOUT = timedelta(seconds=ADMISSION_TIMEOUT_S)
# The ledger's name for a run: the same "<dag_id>/<run_id>" that train_pipeline's tasks build from their
# context (``_run_key``); the training finds its admission by it.
RUN_KEY = "{{ dag_run.dag_id }}/{{ dag_run.run_id }}"
# The least a training task that waits for its GPUs again (preempted, or its admission lapsed) is rescheduled
# by: a task the scheduler queues again before the executor has reported its exit is failed as "killed
# externally" (Airflow's race for reschedules, apache/airflow#71172; the report came 5.5 s after the exit in
# the scheduler replay on a loaded host, and a log upload took 2.3 s)
RESCHEDULE_MIN_S = 10.0


def reschedule_at(config: Any) -> datetime:
    """When a training task that waits for its GPUs again looks next: ``config``'s (a ResourcesConfig)
    ``admission_poll_seconds`` from now, :data:`RESCHEDULE_MIN_S` at least."""
    poll_s = max(config.scheduling.admission_poll_seconds, RESCHEDULE_MIN_S)
    return datetime.now(UTC) + timedelta(seconds=poll_s)


class AdmitOperator(BaseOperator):
    """Wait until the ledger admits the job of ``spec`` (a JobSpec as JSON; its ``resources`` and ``name``
    are read), known to the ledger as ``run_key``."""

    template_fields: Sequence[str] = ("spec", "run_key", "group")
    ui_color = "#e8d5f5"

    def __init__(
        self, *, spec: Any, run_key: str = RUN_KEY, group: str = "", pipeline_team: str | None = None, **kwargs: Any
    ) -> None:
        """``group``: a sweep's trial, one of the sweep run's (its run key); at most ``sweep.parallelism``
        of them are admitted at once. ``pipeline_team``: the team whose own DAG this is (None: the one DAG
        of every team), whose job ``spec`` must be (it comes from an XCom, which users may write)."""
        kwargs["execution_timeout"] = ADMISSION_TIMEOUT
        kwargs["retries"] = 0
        super().__init__(**kwargs)
        self.spec, self.run_key, self.group, self.pipeline_team = spec, run_key, group, pipeline_team

    def _job(self, context: Any) -> Any:
        from trainyard.scheduling.admission.ledger import job_for
        from trainyard.spec import Resources
        from trainyard.teams import check_pipeline_team

        resources = Resources.model_validate(self.spec["resources"])
        check_pipeline_team(resources.team, self.pipeline_team)
        user = getattr(context.get("dag_run"), "triggering_user_name", None)  # None: a scheduled run
        limit = (self.spec.get("sweep") or {}).get("parallelism", 0) if self.group else 0
        return job_for(resources, self.run_key, user, self.group, limit)

    @fail_permanently
    def execute(self, context: Any) -> str:
        from trainyard.scheduling.admission.ledger import default_ledger, look, verdict_in_words

        job = self._job(context)
        ledger = default_ledger()
        verdict = look(ledger, job)
        self.log.info("admission of %s: %s", job.id, verdict_in_words(ledger, job.id, verdict))
        if verdict.final:
            raise PermanentError(f"job {job.id}: {verdict.message}")
        if verdict.admitted:
            return verdict.message
        notice_s = ledger.config.scheduling.queue_wait_notice_minutes * 60
        now = time.time()
        self._wait(job, since=now, notice_at=now + notice_s if notice_s else None)

    def _wait(self, job: Any, since: float, notice_at: float | None) -> NoReturn:
        """Defer to the trigger for what is left of ``ADMISSION_TIMEOUT`` since the job began to wait."""
        from trainyard_airflow.triggers.admission import AdmissionTrigger

        left = ADMISSION_TIMEOUT_S - (time.time() - since)
        if left <= 0:
            raise PermanentError(f"job {job.id}: not admitted within {ADMISSION_TIMEOUT_S / 3600:g} h")
        self.defer(
            trigger=AdmissionTrigger(dataclasses.asdict(job), since=since, notice_at=notice_at),
            method_name="execute_complete",
            timeout=timedelta(seconds=left),
        )

    @fail_permanently
    def execute_complete(self, context: Any, event: Any = None) -> str:
        """Where the task resumes when the trigger hands back instead of ending the task: a job that has
        waited ``scheduling.queue_wait_notice_minutes`` (its team is told, then it waits on), a trigger made
        with ``end_from_trigger=False``, or ``dag.test()``, which runs the trigger in line and passes the
        ending event's state ("success") rather than its XCom."""
        if isinstance(event, dict) and event.get("waiting"):
            from trainyard.scheduling.admission.ledger import default_ledger, look

            job = self._job(context)
            verdict = look(default_ledger(), job)  # renews its place first: the notice may take a while
            if verdict.final:
                raise PermanentError(f"job {job.id}: {verdict.message}")
            if verdict.admitted:  # admitted meanwhile: nothing to tell
                return verdict.message
            self._tell_waiting(context, {**event, "reason": verdict.message})
            self._wait(job, since=event["since"], notice_at=None)
        if isinstance(event, dict) and not event.get("admitted", True):  # cancelled while it waited
            raise PermanentError(event["reason"])
        if event == "failed":  # dag.test() passes the ending event's state: the trigger ended it failed
            raise PermanentError(f"job {self.run_key}: taken out of the queue while it waited")
        return event["reason"] if isinstance(event, dict) else str(event)

    def _tell_waiting(self, context: Any, event: dict) -> None:
        """The ``queue_wait`` notice to the job's team; a notice that cannot be sent costs the wait nothing."""
        from trainyard import notifications
        from trainyard_airflow.notifications import send

        team, name = self.spec["resources"]["team"], self.spec.get("name") or self.run_key
        waited = time.time() - event["since"]
        try:
            send(notifications.queue_wait(team, name, self.run_key, waited, event["reason"]), context)
        except Exception:
            self.log.exception("could not tell the team that %s waits", self.run_key)
