"""Waiting for admission in the triggerer: a job that waits for its GPUs holds no worker and starts none.

The trigger asks the admission ledger (``trainyard.scheduling.admission``) every
``scheduling.admission_poll_seconds``; each look renews the job's place in the queue, as a look of the
reschedule-mode sensor did, but it costs a SQLite transaction in the triggerer instead of a task process
on a worker. When the ledger admits the job, the trigger ends the task itself (``end_from_trigger``), so
the admission is not followed by a worker start either; the reason it got ("admitted: 2 a100-80gb slot(s)
...") is the task's XCom, and every change of the reason it waits for goes to the task log.

A triggerer that dies takes no reservation with it: the job's waiting row runs out (its lease) and its
arrival is kept, so the restarted trigger finds its place again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent


class AdmissionTrigger(BaseTrigger):
    """Ask the ledger for ``job`` (the fields of ``trainyard.scheduling.admission.Job``) until it is admitted."""

    def __init__(self, job: dict[str, Any], end_from_trigger: bool = True) -> None:
        super().__init__()
        self.job = job
        self.end_from_trigger = end_from_trigger

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {"job": self.job, "end_from_trigger": self.end_from_trigger}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.scheduling.admission import Job, default_ledger, look

        ledger = await asyncio.to_thread(default_ledger)
        job = Job(**self.job)
        said = ""
        while True:
            decision = await asyncio.to_thread(look, ledger, job)
            if decision.reason != said:
                self.log.info("admission of %s: %s", job.id, decision.reason)
                said = decision.reason
            if decision.admitted:
                if self.end_from_trigger:
                    yield TaskSuccessEvent(xcoms={"return_value": decision.reason})
                else:
                    yield TriggerEvent({"admitted": True, "reason": decision.reason})
                return
            await asyncio.sleep(ledger.config.scheduling.admission_poll_seconds)
