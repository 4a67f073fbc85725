"""The scheduler replay's training stand-in (bench/replay/replay_standin.py) is preempted as a training is:
it hears the word in the ledger, records the GPU time it held, gives its slots back, waits again in its
place, and its task is rescheduled, not failed. The Airflow replay's preemption figures rest on it."""

import asyncio
import dataclasses
import time

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException

import checkout
from trainyard.scheduling.admission import ledger as ledgers
from trainyard.scheduling.admission.policy import Job, WaitReason
from trainyard.scheduling.resources import parse_resources
from trainyard.training.usage import tries

standin = checkout.load("bench/replay/replay_standin.py")

# vision runs a job on its own quota and one on nlp's idle quota; preempted at once (no minimum runtime),
# a job stops within half a second
FLEET = """\
gpu_types:
  a100: {count: 4, price_per_hour: 1.0}
teams:
  vision: {quota: {a100: 2}, borrowing_limit: {a100: 2}}
  nlp: {quota: {a100: 2}}
scheduling:
  admission_poll_seconds: 1
  preemption: {enabled: true, min_runtime_minutes: 0, max_preemptions: 2, grace_seconds: 0.5}
"""


def test_a_preempted_stand_in_records_its_hold_gives_its_slots_back_and_is_rescheduled(tmp_path, monkeypatch):
    ledger = ledgers.Ledger(tmp_path / "admission.db", parse_resources(FLEET))
    monkeypatch.setattr(ledgers, "default_ledger", lambda: ledger)
    own, borrower = Job("v1", "vision", "a100", 2, 1, 1.0), Job("v2", "vision", "a100", 2, 1, 1.0)
    lender = Job("n", "nlp", "a100", 2, 1, 1.0)
    assert ledger.request(own).admitted and ledger.request(borrower).admitted and ledger.renew(borrower.id)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = time.time()
    hold = standin.HoldTrigger(dataclasses.asdict(borrower), str(run_dir), started, started + 60)

    async def preempted_while_holding():
        events = hold.run()
        heard = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.2)
        said = await asyncio.to_thread(ledger.request, lender)
        assert said.reason is WaitReason.PREEMPTING, said.message
        return await asyncio.wait_for(heard, 10)

    event = asyncio.run(preempted_while_holding())
    assert event.payload == {"status": standin.PREEMPTED}
    (held,) = tries(run_dir)  # its GPU time is counted, once
    assert (held["attempt"], held["gpus"], held["started"]) == (1, 2, started)
    assert held["ended"] - started < 5  # it stopped at the word, not at its end
    assert ledger.request(lender).admitted  # its slots went back
    (waiting,) = [e for e in ledger.entries() if e.job.id == borrower.id]
    assert (waiting.admitted, waiting.preemptions) == (None, 1)  # in its old place, one preemption more

    # the task goes back to waiting, not failed: rescheduled at the next look
    operator = standin.HoldSlots(task_id="train", spec={}, seconds=60, run_key="r")
    with pytest.raises(AirflowRescheduleException):
        operator.execute_complete({}, event.payload)
    assert operator.execute_complete({}, None) is None  # a hold that ran out ends the task
