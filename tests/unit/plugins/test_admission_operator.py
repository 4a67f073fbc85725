"""Waiting for admission deferred: the operator's one look on the worker, the trigger's looks from the
triggerer, and the event that ends the task without a worker once the job is admitted."""

import asyncio
import dataclasses
import json
import time
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from fleets import local_fleet
from trainyard.scheduling.admission.policy import Job
from trainyard_airflow.operators.admission import ADMISSION_TIMEOUT, AdmitOperator
from trainyard_airflow.triggers.admission import AdmissionTrigger, AdmissionWatch
from webhook import webhook_receiver

FLEET = """\
gpu_types:
  a100: {count: 2, price_per_hour: 1.0}
teams:
  vision: {quota: {a100: 2}}
scheduling:
  admission_poll_seconds: 0.05
"""


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    return local_fleet(tmp_path, monkeypatch, FLEET)


def spec(gpus: int) -> dict:
    return {"resources": {"team": "vision", "gpu_type": "a100", "nodes": 1, "gpus_per_node": gpus}}


def test_a_job_admitted_at_once_is_done_on_the_worker(fleet):
    op = AdmitOperator(task_id="admit", spec=spec(2), run_key="train_pipeline/r1")
    assert op.execute({}) == "admitted: 2 a100 slot(s) for team vision"
    assert op.execution_timeout == ADMISSION_TIMEOUT


def test_a_waiting_job_defers_and_its_trigger_ends_the_task_once_admitted(fleet):
    first = Job("train_pipeline/r1", "vision", "a100", 2, 1, 1.0)
    assert fleet.request(first).admitted
    op = AdmitOperator(task_id="admit", spec=spec(1), run_key="train_pipeline/r2")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, AdmissionTrigger)
    assert ADMISSION_TIMEOUT - deferred.value.timeout < timedelta(seconds=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "trainyard_airflow.triggers.admission.AdmissionTrigger"
    assert kwargs["job"] == dataclasses.asdict(Job("train_pipeline/r2", "vision", "a100", 1, 1, 24.0))

    async def wait_then_free() -> TriggerEvent:
        events = AdmissionTrigger(**kwargs).run()
        waiting = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.3)  # several looks: still full
        assert not waiting.done()
        await asyncio.to_thread(fleet.release, first.id)
        return await asyncio.wait_for(waiting, 10)

    event = asyncio.run(wait_then_free())
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms == {"return_value": "admitted: 1 a100 slot(s) for team vision"}
    assert [e.job.id for e in fleet.entries() if e.admitted is not None] == ["train_pipeline/r2"]


def test_freed_slots_reach_waiting_triggers_at_once_whatever_the_poll(tmp_path, monkeypatch):
    """With a minute between looks, two jobs waiting in one triggerer start within a second of the slots
    coming free: the watch wakes the first to look, its look admits both, and the watch wakes the second."""
    ledger = local_fleet(
        tmp_path, monkeypatch, FLEET.replace("admission_poll_seconds: 0.05", "admission_poll_seconds: 60")
    )
    running = Job("train_pipeline/r1", "vision", "a100", 2, 1, 1.0)
    assert ledger.request(running).admitted
    waiting = [Job(f"train_pipeline/r{i}", "vision", "a100", 1, 1, 1.0) for i in (2, 3)]

    async def free_then_wait() -> list[TriggerEvent]:
        events = [AdmissionTrigger(dataclasses.asdict(j)).run() for j in waiting]
        firsts = [asyncio.ensure_future(e.__anext__()) for e in events]
        watch = AdmissionWatch.of(asyncio.get_running_loop())
        # both looked once and wait for their next look, a minute away; the watch has read the ledger since
        deadline = time.monotonic() + 30
        while (
            watch.admitted != {running.id} or len(watch.waiting) < 2 or any(w.is_set() for w in watch.waiting.values())
        ):
            assert time.monotonic() < deadline, (watch.admitted, watch.waiting)
            await asyncio.sleep(0.05)
        assert not any(f.done() for f in firsts)
        await asyncio.to_thread(ledger.release, running.id)
        return await asyncio.wait_for(asyncio.gather(*firsts), 5)

    got = asyncio.run(free_then_wait())
    assert all(isinstance(e, TaskSuccessEvent) for e in got)
    assert sorted(e.job.id for e in ledger.entries() if e.admitted is not None) == [j.id for j in waiting]


def test_without_end_from_trigger_the_task_resumes_with_the_reason(fleet):
    job = Job("train_pipeline/r3", "vision", "a100", 1, 1, 1.0)

    async def first_event() -> TriggerEvent:
        return await AdmissionTrigger(dataclasses.asdict(job), end_from_trigger=False).run().__anext__()

    event = asyncio.run(first_event())
    assert event.payload == {"admitted": True, "reason": "admitted: 1 a100 slot(s) for team vision"}
    op = AdmitOperator(task_id="admit", spec=spec(1), run_key=job.id)
    assert op.execute_complete({}, event.payload) == "admitted: 1 a100 slot(s) for team vision"


def test_a_job_waiting_past_the_notice_time_tells_its_team_once_and_waits_on(tmp_path, monkeypatch):
    """The trigger hands back after ``queue_wait_notice_minutes``; the task posts the notice to the team's
    webhook (a real HTTP server) and defers again, for what is left of its wait, with no second notice due."""
    ledger = local_fleet(
        tmp_path,
        monkeypatch,
        FLEET.replace("vision: {quota: {a100: 2}}", "vision: {quota: {a100: 2}, notify: [vision_hook]}")
        + "  queue_wait_notice_minutes: 0.005\n",  # 0.3 s
    )
    assert ledger.request(Job("train_pipeline/r1", "vision", "a100", 2, 1, 1.0)).admitted
    op = AdmitOperator(task_id="admit", spec={**spec(1), "name": "digits"}, run_key="train_pipeline/r2")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["notice_at"] == pytest.approx(kwargs["since"] + 0.3)

    async def first_event() -> TriggerEvent:
        return await asyncio.wait_for(AdmissionTrigger(**kwargs).run().__anext__(), 10)

    event = asyncio.run(first_event())
    assert event.payload["waiting"] and event.payload["since"] == kwargs["since"]
    with webhook_receiver() as (port, received):
        conn = {"conn_type": "http", "host": "127.0.0.1", "schema": "http", "port": port}
        monkeypatch.setenv("AIRFLOW_CONN_VISION_HOOK", json.dumps(conn))
        with pytest.raises(TaskDeferred) as again:
            op.execute_complete({}, event.payload)
    [notice] = received
    assert notice["kind"] == "queue_wait" and notice["job"] == "digits" and notice["run"] == "train_pipeline/r2"
    assert notice["waited_s"] >= 0.3 and notice["reason"] == "a100: 2 of 2 slots in use, the job needs 1"
    assert notice["subject"].startswith("[trainyard] digits: waiting for its GPUs for 0.")
    resumed = again.value.trigger.serialize()[1]
    assert resumed["notice_at"] is None and resumed["since"] == kwargs["since"]
    assert again.value.timeout < ADMISSION_TIMEOUT
    # the wait's time is counted from its start: a job past the admission timeout fails, without a retry
    with pytest.raises(AirflowFailException, match="not admitted within"):
        op.execute_complete({}, {**event.payload, "since": kwargs["since"] - ADMISSION_TIMEOUT.total_seconds()})


def test_a_spec_of_another_team_than_its_dag_s_is_refused_before_it_queues(fleet):
    """The spec reaches admit through an XCom, which a user may write: one that names another team than
    the DAG's own (multi-team mode: train_pipeline.<team>) takes nothing of that team's quota."""
    from airflow.sdk.exceptions import AirflowFailException

    op = AdmitOperator(task_id="admit", spec=spec(2), run_key="train_pipeline.nlp/r1", pipeline_team="nlp")
    with pytest.raises(AirflowFailException, match="resources.team: 'vision' is not the team of train_pipeline.nlp"):
        op.execute({})
    assert fleet.entries() == []


def test_a_waiting_job_s_log_says_its_place_and_says_it_again_while_it_waits(fleet, monkeypatch):
    """What the task log of a waiting ``admit`` says: why, its place among the jobs waiting for its GPU
    type, how long it has waited; said again every STILL_WAITING_LOG_S though nothing changed."""
    from structlog.testing import capture_logs

    from trainyard_airflow.triggers import admission

    monkeypatch.setattr(admission, "STILL_WAITING_LOG_S", 0.2)
    assert fleet.request(Job("train_pipeline/r1", "vision", "a100", 2, 1, 1.0)).admitted
    assert not fleet.request(Job("train_pipeline/r2", "vision", "a100", 1, 1, 1.0)).admitted  # waits first
    job = Job("train_pipeline/r3", "vision", "a100", 2, 1, 1.0)

    async def watch_it_wait() -> None:
        trigger = AdmissionTrigger(dataclasses.asdict(job), since=time.time() - 600)
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.7)  # a look every 0.05 s, each with the same verdict
        assert not waiting.done()
        waiting.cancel()

    with capture_logs() as logs:
        asyncio.run(watch_it_wait())
    said = [e["event"] % e.get("positional_args", ()) for e in logs]
    said = [line for line in said if line.startswith(f"admission of {job.id}:")]
    why = "2 of 2 slots in use, the job needs 2"  # the verdict's "a100: ..." said once, after its type
    # its latest start: r1 ends by its max_hours (1 h), then r2 (first in line, 1 slot) runs its hour
    by = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(fleet.entries()[0].admitted + 2 * 3600))
    bound = f"starts by {by} if the running jobs end by their max_hours and no later job passes it"
    place = f"waiting, 2 of 2 for a100: {why}; {bound}"
    assert said[0] == f"admission of {job.id}: {place} (waiting 10 min)", said
    assert 2 <= len(said) <= 5 and len(set(said)) == 1, said
