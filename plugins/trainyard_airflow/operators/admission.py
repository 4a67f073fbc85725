"""``AdmitOperator``: a job's GPUs from the admission ledger before its training task starts.

One look on the worker; a job admitted at once (the usual case on an idle fleet, and every CPU job of
the default team) is done there. Otherwise the task defers to
:class:`trainyard_airflow.triggers.admission.AdmissionTrigger`, which looks again from the triggerer and
ends the task itself once the job is admitted: a queue of a hundred waiting jobs holds no worker and
starts no task process, where a reschedule-mode sensor started one per look. The task's XCom is the
ledger's reason ("admitted: 4 a100-80gb slot(s) for team vision, 2 of them borrowed").

``execution_timeout`` bounds the wait (the deferral's timeout); the job's row in the ledger then runs out
with its lease. Parse-light: trainyard's scheduling modules are imported when the task runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

ADMISSION_TIMEOUT = timedelta(days=7)  # the longest a job waits for its GPUs before its run fails


class AdmitOperator(BaseOperator):
    """Wait until the ledger admits the job of ``spec`` (a JobSpec as JSON; only ``resources`` is read),
    known to the ledger as ``run_key``."""

    template_fields: Sequence[str] = ("spec", "run_key")
    ui_color = "#e8d5f5"

    def __init__(self, *, spec: Any, run_key: str, **kwargs: Any) -> None:
        kwargs.setdefault("execution_timeout", ADMISSION_TIMEOUT)
        super().__init__(**kwargs)
        self.spec, self.run_key = spec, run_key

    def execute(self, context: Any) -> str:
        from trainyard.scheduling.admission import default_ledger, job_for, look
        from trainyard.spec import Resources
        from trainyard_airflow.triggers.admission import AdmissionTrigger

        job = job_for(Resources.model_validate(self.spec["resources"]), self.run_key)
        decision = look(default_ledger(), job)
        self.log.info("admission of %s: %s", job.id, decision.reason)
        if decision.admitted:
            return decision.reason
        self.defer(
            trigger=AdmissionTrigger(dataclasses.asdict(job)),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def execute_complete(self, context: Any, event: Any = None) -> str:
        """Where the task resumes if the trigger hands back instead of ending it (``dag.test()`` runs the
        trigger in line and resumes here)."""
        return event["reason"] if isinstance(event, dict) else str(event)
