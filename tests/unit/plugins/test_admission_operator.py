"""Waiting for admission deferred: the operator's one look on the worker, the trigger's looks from the
triggerer, and the event that ends the task without a worker once the job is admitted."""

import asyncio
import dataclasses

import pytest
from airflow.sdk.exceptions import TaskDeferred
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from trainyard.scheduling.admission import Job, default_ledger
from trainyard_airflow.operators.admission import ADMISSION_TIMEOUT, AdmitOperator
from trainyard_airflow.triggers.admission import AdmissionTrigger

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
    config = tmp_path / "config"
    config.mkdir()
    (config / "resources.yaml").write_text(FLEET)
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    return default_ledger()


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
    assert isinstance(trigger, AdmissionTrigger) and deferred.value.timeout == ADMISSION_TIMEOUT
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


def test_without_end_from_trigger_the_task_resumes_with_the_reason(fleet):
    job = Job("train_pipeline/r3", "vision", "a100", 1, 1, 1.0)

    async def first_event() -> TriggerEvent:
        return await AdmissionTrigger(dataclasses.asdict(job), end_from_trigger=False).run().__anext__()

    event = asyncio.run(first_event())
    assert event.payload == {"admitted": True, "reason": "admitted: 1 a100 slot(s) for team vision"}
    op = AdmitOperator(task_id="admit", spec=spec(1), run_key=job.id)
    assert op.execute_complete({}, event.payload) == "admitted: 1 a100 slot(s) for team vision"
