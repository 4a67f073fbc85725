"""
### retrain_&lt;job&gt;

One DAG per job file in the jobs folder (`TRAINYARD_JOBS_DIR`, default `$TRAINYARD_HOME/jobs`): a JobSpec
plus `schedule` (cron and timezone) and/or `retrain_on: new_commits` (a new commit on the branch that
`dataset.ref` names, announced as an event on the branch's asset by `ingest_dataset`, `trainyard data
upload` or a REST call).

`pin_commit` → `train`

In Airflow's multi-team mode a job file's DAG is in its team's own bundle and starts its team's
`train_pipeline.<team>`.

`pin_commit` pins the commit the run saw (the newest triggering event's, else the branch head now) and skips
the run, saying why, when the model's newest registered version was trained on that commit from that very
spec. `train` starts a run of its team's `train_pipeline.<team>` on the pinned spec and waits for it
(deferred, holding no worker): the job goes through the queue like any other, is billed to its team,
and this run fails when that one does. A job file that is not valid makes no DAG; `retrain_jobs_errors.py` reports it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, dag, get_current_context, task

from trainyard.retraining import RetrainingJob, load_jobs_folder
from trainyard.teams import training_dag
from trainyard_airflow.errors import fail_permanently
from trainyard_airflow.notifications import TeamNotifier
from trainyard_airflow.team_dags import bundle_team, makes_dags

# In Airflow's multi-team mode this file is read in every team's bundle and makes there the DAGs of that
# team's job files, which start its own train_pipeline.<team>; in the shared bundle it makes none.
TEAM = bundle_team(__file__)


def _schedule(job: RetrainingJob) -> Any:
    """The job's timetable: its cron, its branch's asset, or whichever comes first."""
    cron = job.schedule and CronTriggerTimetable(job.schedule.cron, timezone=job.schedule.timezone)
    asset = job.retrain_on and Asset(job.dataset_uri)
    if cron and asset:
        return AssetOrTimeSchedule(timetable=cron, assets=[asset])
    return cron or [asset]


def _job_dag(job: RetrainingJob) -> Any:
    @dag(
        dag_id=job.dag_id,
        schedule=_schedule(job),
        catchup=False,
        max_active_runs=1,  # events that arrive meanwhile are merged into the next run
        is_paused_upon_creation=False,  # a job file in the folder is meant to run
        default_args={"owner": "trainyard", "retries": 1, "retry_delay": timedelta(seconds=10)},
        tags=["trainyard", "retraining", f"team:{job.spec.resources.team}"],
        doc_md=__doc__,
    )
    def retrain() -> None:
        # its team hears when the job cannot start (a refused event, an unreachable store); a training that
        # fails is told by train_pipeline's own tasks
        @task(multiple_outputs=True, on_failure_callback=[TeamNotifier(event="failure", team=job.spec.resources.team)])
        @fail_permanently
        def pin_commit() -> dict:
            """The dataset commit this run trains on; skipped when that commit and spec are already registered."""
            from airflow.sdk.exceptions import AirflowSkipException

            from trainyard.retraining import plan_retraining
            from trainyard_airflow.hooks.lakefs_hook import register_store

            register_store()  # a lakeFS dataset: its connection

            triggering = get_current_context().get("triggering_asset_events") or {}
            asset = Asset(job.dataset_uri)
            events = sorted(triggering[asset], key=lambda e: e.timestamp) if asset in triggering else []
            plan = plan_retraining(job, [dict(e.extra or {}) for e in events])
            if plan["skip"]:
                raise AirflowSkipException(plan["skip"])
            return plan

        plan: Any = pin_commit()  # its conf is read by key (multiple_outputs)
        TriggerDagRunOperator(
            task_id="train",
            trigger_dag_id=training_dag(TEAM),
            trigger_run_id="{{ dag.dag_id }}__{{ run_id }}",
            conf=plan["conf"],
            note=f"{job.spec.headline()}, retraining on new data",
            wait_for_completion=True,
            deferrable=True,
            poke_interval=15,
            allowed_states=["success"],
            failed_states=["failed"],
            fail_when_dag_is_paused=True,
            retries=0,  # the training run retries its own tasks; a second run of the same id cannot start
            doc_md="Starts the team's train_pipeline on the pinned spec and waits for its end, deferred.",
        )

    return retrain()


_jobs, _ = load_jobs_folder()  # the files with errors: retrain_jobs_errors.py
for _job in (j for j in _jobs if makes_dags(TEAM) and (TEAM is None or j.spec.resources.team == TEAM)):
    try:
        globals()[_job.dag_id] = _job_dag(_job)
    except Exception:  # noqa: BLE001 - one job's DAG that Airflow refuses must not take the others down
        logging.getLogger(__name__).exception("job file %s made no DAG", _job.name)
