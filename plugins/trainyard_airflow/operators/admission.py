"""``AdmitOperator``: a job's GPUs from the admission ledger before its training task starts.

One look on the worker; a job admitted at once (the usual case on an idle fleet, and every CPU job of
the default team) is done there. Otherwise the task defers to
:class:`trainyard_airflow.triggers.admission.AdmissionTrigger`, which looks again from the triggerer and
ends the task itself once the job is admitted: waiting jobs hold no worker and start no task process,
where a reschedule-mode sensor started one per look. The task's XCom is the ledger's reason ("admitted:
4 a100-80gb slot(s) for team vision, 2 of them borrowed").

A job waits at most ``ADMISSION_TIMEOUT_S`` (the deferral's timeout); then its run fails, without a
retry (another week of waiting is not what a retry is for), and its row in the ledger runs out with its
lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from trainyard.errors import PermanentError
from trainyard.scheduling.admission import ADMISSION_TIMEOUT_S
from trainyard_airflow.errors import fail_permanently

ADMISSION_TIMEOUT = timedelta(seconds=ADMISSION_TIMEOUT_S)
# The ledger's name for a run: the same "<dag_id>/<run_id>" that train_pipeline's tasks build from their
# context (``_run_key``); the training finds its admission by it.
RUN_KEY = "{{ dag_run.dag_id }}/{{ dag_run.run_id }}"


class AdmitOperator(BaseOperator):
    """Wait until the ledger admits the job of ``spec`` (a JobSpec as JSON; only ``resources`` is read),
    known to the ledger as ``run_key``."""

    template_fields: Sequence[str] = ("spec", "run_key", "group")
    ui_color = "#e8d5f5"

    def __init__(self, *, spec: Any, run_key: str = RUN_KEY, group: str = "", **kwargs: Any) -> None:
        """``group``: a sweep's trial, one of the sweep run's (its run key); at most ``sweep.parallelism``
        of them are admitted at once."""
        kwargs["execution_timeout"] = ADMISSION_TIMEOUT
        kwargs["retries"] = 0
        super().__init__(**kwargs)
        self.spec, self.run_key, self.group = spec, run_key, group

    @fail_permanently
    def execute(self, context: Any) -> str:
        from trainyard.scheduling.admission import default_ledger, job_for, look
        from trainyard.spec import Resources
        from trainyard_airflow.triggers.admission import AdmissionTrigger

        user = getattr(context.get("dag_run"), "triggering_user_name", None)  # None: a scheduled run
        limit = (self.spec.get("sweep") or {}).get("parallelism", 0) if self.group else 0
        job = job_for(Resources.model_validate(self.spec["resources"]), self.run_key, user, self.group, limit)
        decision = look(default_ledger(), job)
        self.log.info("admission of %s: %s", job.id, decision.reason)
        if decision.cancelled:
            raise PermanentError(f"job {job.id}: {decision.reason}")
        if decision.admitted:
            return decision.reason
        self.defer(
            trigger=AdmissionTrigger(dataclasses.asdict(job)),
            method_name="execute_complete",
            timeout=ADMISSION_TIMEOUT,
        )

    @fail_permanently
    def execute_complete(self, context: Any, event: Any = None) -> str:
        """Where the task resumes when the trigger hands back instead of ending the task: a trigger made
        with ``end_from_trigger=False``, or ``dag.test()``, which runs the trigger in line and passes the
        ending event's state ("success") rather than its XCom."""
        if isinstance(event, dict) and not event.get("admitted", True):  # cancelled while it waited
            raise PermanentError(event["reason"])
        if event == "failed":  # dag.test() passes the ending event's state: the trigger ended it failed
            raise PermanentError(f"job {self.run_key}: taken out of the queue while it waited")
        return event["reason"] if isinstance(event, dict) else str(event)
