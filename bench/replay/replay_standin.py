"""The training stand-in of the scheduler replay (``bench/scheduler.py``): it holds a job's GPU slots for a
given time without a process or a GPU, so a fleet of 56 virtual slots fits on 2 cores.

``HoldSlots`` runs where a training task runs (the ``gpu-*`` pool and ``pool_slots`` of the run's
``resources``, set by the cluster policy), checks that the job is admitted, writes the run's config and
defers; the pools count deferred tasks, so its slots stay held. ``HoldTrigger`` renews the job's admission
lease while it waits (as ``trainyard.scheduling.admission.lease.hold`` does for a real training), then records the
try's GPU time as a training does (``usage.jsonl``, what ``trainyard report cost`` reads), hands the
admission back and ends the task from the triggerer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent


class HoldTrigger(BaseTrigger):
    def __init__(self, job: dict[str, Any], run_dir: str, attempt: int, started: float, until: float) -> None:
        super().__init__()
        self.job, self.run_dir, self.attempt, self.started, self.until = job, run_dir, attempt, started, until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        fields = ("job", "run_dir", "attempt", "started", "until")
        return f"{__name__}.{type(self).__name__}", {k: getattr(self, k) for k in fields}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.scheduling.admission.lease import HEARTBEAT_S
        from trainyard.scheduling.admission.ledger import default_ledger
        from trainyard.scheduling.admission.policy import Job
        from trainyard.training.usage import record_try, tries

        ledger = await asyncio.to_thread(default_ledger)
        job = Job(**self.job)
        while (left := self.until - time.time()) > 0:
            await asyncio.sleep(min(left, HEARTBEAT_S))
            if not await asyncio.to_thread(ledger.renew, job.id):  # as lease.hold does: ask again
                self.log.warning("admission of %s ran out while holding; asking again", job.id)
                await asyncio.to_thread(ledger.request, job)
        # a triggerer restarted after this point runs it again: record the try once
        recorded = await asyncio.to_thread(tries, self.run_dir)
        if not any(t["attempt"] == self.attempt for t in recorded):
            await asyncio.to_thread(
                record_try,
                self.run_dir,
                attempt=self.attempt,
                started=self.started,
                ended=time.time(),
                gpus=job.slots,
                where="replay",
            )
        await asyncio.to_thread(ledger.release, job.id)
        yield TaskSuccessEvent()


class HoldSlots(BaseOperator):
    """Hold the admitted job's slots for ``seconds``."""

    template_fields: Sequence[str] = ("spec", "seconds", "run_key")

    def __init__(self, *, spec: Any, seconds: Any, run_key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec, self.seconds, self.run_key = spec, seconds, run_key

    def execute(self, context: Any) -> None:
        from trainyard import paths
        from trainyard.scheduling.admission.ledger import NotAdmitted, default_ledger, job_for
        from trainyard.spec import Resources, safe_key
        from trainyard.training.run_config import RUN_CONFIG_FILE

        resources = Resources.model_validate(self.spec["resources"])
        job = job_for(resources, self.run_key)
        if not default_ledger().renew(job.id):
            raise NotAdmitted(f"job {job.id} holds no admission")
        run_dir = paths.runs_root() / "replay" / safe_key(self.run_key)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_CONFIG_FILE).write_text(json.dumps({"spec": {"resources": resources.model_dump(mode="json")}}))
        started = time.time()
        attempt = context["ti"].try_number
        self.defer(
            trigger=HoldTrigger(dataclasses.asdict(job), str(run_dir), attempt, started, started + float(self.seconds)),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: Any = None) -> None:
        return None
