"""The scheduler replay's training stand-in (bench/replay/replay_standin.py) is preempted as a training is:
it hears the word in the ledger, records the GPU time it held, gives its slots back, waits again in its
place, and its task is rescheduled, not failed. The Airflow replay's preemption figures rest on it."""

import asyncio
import dataclasses
import time
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException

import checkout
from trainyard.scheduling.admission import ledger as ledgers
from trainyard.scheduling.admission.policy import Job, WaitReason
from trainyard.scheduling.resources import parse_resources
from trainyard.training.usage import tries
from trainyard_airflow.operators.admission import RESCHEDULE_MIN_S

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
    assert (held["attempt"], held["gpus"], held["started"], held["where"]) == (1, 2, started, standin.PREEMPTED_WHERE)
    assert held["ended"] - started < 5  # it stopped at the word, not at its end
    assert ledger.request(lender).admitted  # its slots went back
    (waiting,) = [e for e in ledger.entries() if e.job.id == borrower.id]
    assert (waiting.admitted, waiting.preemptions) == (None, 1)  # in its old place, one preemption more

    # the task goes back to waiting, not failed: rescheduled at the next look
    operator = standin.HoldSlots(task_id="train", spec={}, seconds=60, run_key="r")
    with pytest.raises(AirflowRescheduleException) as rescheduled:
        operator.execute_complete({}, event.payload)
    # not sooner than the executor reports its exit (else Airflow fails it as killed externally)
    assert (rescheduled.value.reschedule_date - datetime.now(UTC)).total_seconds() > RESCHEDULE_MIN_S - 2


def test_the_replay_s_figures_from_the_stand_ins_records(tmp_path):
    """bench/scheduler.py's held_slots: utilisation over the window by the holds, a preemption per hold that
    ended in one (a run that failed after it included), the restart counted as lost, and the wait of the
    jobs their quota had room for when they arrived."""
    from trainyard.spec import safe_key
    from trainyard.training.usage import record_try

    scheduler = checkout.scheduler_replay()
    config = tmp_path / "config"
    config.mkdir()
    (config / "resources.yaml").write_text(FLEET)
    t0 = 1000.0
    trace = [
        scheduler.TraceJob("v2", 0.0, "vision", "a100", 2, 30.0),  # borrows, preempted at 20, back at 40
        scheduler.TraceJob("n", 5.0, "nlp", "a100", 2, 10.0),  # the lender: its quota was free when it came
        scheduler.TraceJob("v3", 6.0, "vision", "a100", 2, 10.0),  # preempted, then its run failed
    ]
    holds = {
        "v2": [(1000, 1020, standin.PREEMPTED_WHERE), (1040, 1052, "replay")],
        "n": [(1021, 1031, "replay")],
        "v3": [(1010, 1015, standin.PREEMPTED_WHERE)],
    }
    for name, spans in holds.items():
        for i, (started, ended, where) in enumerate(spans, 1):
            run_dir = tmp_path / "home" / "runs" / "replay" / safe_key(f"{scheduler.DAG}/{name}")
            run_dir.mkdir(parents=True, exist_ok=True)
            record_try(run_dir, attempt=i, started=started, ended=ended, gpus=2, where=where)
    env = {"TRAINYARD_HOME": str(tmp_path / "home"), "TRAINYARD_CONFIG_DIR": str(config)}
    figures = scheduler.held_slots(env, trace, t0, 100.0, ["a100"], restart_s=2.0)
    assert (figures["preemptions"], figures["most_preemptions_of_a_job"]) == (2, 1)
    assert figures["gpu_seconds_lost_share"] == pytest.approx(2 * 2.0 * 2 / (30 * 2 + 10 * 2 + 10 * 2))
    assert figures["utilisation"] == pytest.approx(2 * (20 + 12 + 10 + 5) / (4 * 100.0))
    # n waited 16 s for its quota, v2 none; v3 came while v2 held vision's whole quota: not counted
    assert figures["p95_wait_quota_free_s"] == pytest.approx(scheduler.p95([0.0, 16.0]))
    assert figures["unrecorded"] == []
