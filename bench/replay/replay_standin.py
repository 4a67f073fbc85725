"""The training stand-in of the scheduler replay (``bench/scheduler.py``): it holds a job's GPU slots for a
given time without a process or a GPU, so a fleet of 56 virtual slots fits on 2 cores.

``HoldSlots`` runs where a training task runs (the ``gpu-*`` pool and ``pool_slots`` of the run's
``resources``, set by the cluster policy), checks that the job is admitted, writes the run's config and
defers; the pools count deferred tasks, so its slots stay held. ``HoldTrigger`` renews the job's admission
lease while it waits (as ``trainyard.scheduling.admission.lease.hold`` does for a real training), then records the
hold's GPU time as a training does (``usage.jsonl``, what ``trainyard report cost`` reads), hands the
admission back and ends the task from the triggerer.

Preempted, it does what a real training does (``lease.hold`` and the local launcher): it hears the word in
the ledger, stops at once (a checkpoint at its next step), records the GPU time it held, gives its slots
back and waits again in its old place (``Ledger.requeue``); its task is rescheduled, not failed. Admitted
again, it holds the time it had left plus ``restart_seconds`` (starting again: its processes, loading its
checkpoint and data), the GPU time lost to the preemption.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

PREEMPTED = "preempted"  # the event of a hold that heard the word
PREEMPTED_WHERE = "replay, preempted"  # the usage record of such a hold (where="replay" for one that ran out)


class HoldTrigger(BaseTrigger):
    def __init__(self, job: dict[str, Any], run_dir: str, started: float, until: float) -> None:
        super().__init__()
        self.job, self.run_dir, self.started, self.until = job, run_dir, started, until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        fields = ("job", "run_dir", "started", "until")
        return f"{__name__}.{type(self).__name__}", {k: getattr(self, k) for k in fields}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.scheduling.admission.lease import HEARTBEAT_S, WORD_POLL_S
        from trainyard.scheduling.admission.ledger import default_ledger
        from trainyard.scheduling.admission.policy import Job
        from trainyard.scheduling.ledger_db import DatabaseUnavailable

        ledger = await asyncio.to_thread(default_ledger)
        job = Job(**self.job)
        preemption = ledger.config.scheduling.preemption
        # the word is looked for at least once per grace (the replay scales the grace with its time)
        look_s = min(WORD_POLL_S, preemption.grace_seconds)
        renewed = time.time()
        while (left := self.until - time.time()) > 0:
            await asyncio.sleep(min(left, look_s))
            try:
                if preemption.enabled and await asyncio.to_thread(ledger.preempted_for, job.id):
                    await self._record(time.time(), job.slots, PREEMPTED_WHERE)
                    await asyncio.to_thread(ledger.requeue, job.id)
                    yield TriggerEvent({"status": PREEMPTED})
                    return
                if time.time() - renewed < HEARTBEAT_S:
                    continue
                renewed = time.time()
                if not await asyncio.to_thread(ledger.renew, job.id):  # as lease.hold does: ask again
                    self.log.warning("admission of %s ran out while holding; asking again", job.id)
                    await asyncio.to_thread(ledger.request, job)
            except DatabaseUnavailable as err:  # as lease.hold's heartbeat: tried again at the next look
                self.log.warning("the ledger did not answer for %s: %s", job.id, err)
        await self._record(time.time(), job.slots, "replay")
        await asyncio.to_thread(ledger.release, job.id)
        yield TaskSuccessEvent()

    async def _record(self, ended: float, gpus: int, where: str) -> None:
        """This hold's usage record, once: a triggerer restarted after it runs the trigger again."""
        from trainyard.training.usage import record_try, tries

        recorded = await asyncio.to_thread(tries, self.run_dir)
        if any(t["started"] == self.started for t in recorded):
            return
        attempt = len(recorded) + 1  # as a launch numbers its tries (launchers.base.next_attempt)
        await asyncio.to_thread(
            record_try, self.run_dir, attempt=attempt, started=self.started, ended=ended, gpus=gpus, where=where
        )


class HoldSlots(BaseOperator):
    """Hold the admitted job's slots for ``seconds`` of work; ``restart_seconds`` more after each preemption."""

    template_fields: Sequence[str] = ("spec", "seconds", "run_key", "restart_seconds")

    def __init__(self, *, spec: Any, seconds: Any, run_key: str, restart_seconds: Any = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec, self.seconds, self.run_key, self.restart_seconds = spec, seconds, run_key, restart_seconds

    def execute(self, context: Any) -> None:
        from trainyard import paths
        from trainyard.scheduling.admission.lease import admitted
        from trainyard.scheduling.admission.ledger import NotAdmitted, default_ledger, job_for
        from trainyard.spec import Resources, safe_key
        from trainyard.training.run_config import RUN_CONFIG_FILE
        from trainyard.training.usage import tries

        resources = Resources.model_validate(self.spec["resources"])
        job = job_for(resources, self.run_key)
        ledger = default_ledger()
        run_dir = paths.runs_root() / "replay" / safe_key(self.run_key)
        held = tries(run_dir)  # each ended in a preemption: a hold that ran out ended the task
        if held:  # preempted: it waits in its old place until admitted again, as a training does
            try:
                admitted(ledger, job)
            except NotAdmitted as err:
                self._reschedule(ledger, str(err))
        elif not ledger.renew(job.id):  # the admit task admitted it: no admission here is a fault
            raise NotAdmitted(f"job {job.id} holds no admission")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_CONFIG_FILE).write_text(json.dumps({"spec": {"resources": resources.model_dump(mode="json")}}))
        worked = sum(t["ended"] - t["started"] for t in held)
        left = float(self.seconds) - worked + float(self.restart_seconds) * len(held)
        started = time.time()
        self.defer(
            trigger=HoldTrigger(dataclasses.asdict(job), str(run_dir), started, started + max(left, 0.0)),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: Any = None) -> None:
        from trainyard.scheduling.admission.ledger import default_ledger

        if isinstance(event, dict) and event.get("status") == PREEMPTED:
            self._reschedule(default_ledger(), "preempted: it gave its slots back and waits again in its place")

    def _reschedule(self, ledger: Any, why: str) -> NoReturn:
        """Back to waiting, not failed: the task is rescheduled and asks again at the next look."""
        from airflow.sdk.exceptions import AirflowRescheduleException

        from trainyard_airflow.operators.admission import reschedule_at

        again = reschedule_at(ledger.config)
        self.log.info("%s; looking again at %s", why, again.isoformat(timespec="seconds"))
        raise AirflowRescheduleException(again)
