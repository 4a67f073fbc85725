"""### scheduler_replay

One job of the scheduler replay (``bench/scheduler.py``, ``make bench-scheduler``): the admission of
``train_pipeline`` (the same ``AdmitOperator``), then a stand-in that holds the job's slots of its GPU
pool for ``hold_seconds`` instead of training. The run's ``conf`` is ``{"resources": {...}, "hold_seconds":
s, "restart_seconds": r}`` (``r``, default 0: the time a preempted job spends starting again); the cluster
policy puts ``train`` in the pool and slots of ``resources``, as for a real training.
"""

from __future__ import annotations

from airflow.sdk import dag
from replay_standin import HoldSlots

from trainyard.scheduling.admission.ledger import RUNS_IN_FLIGHT
from trainyard_airflow.operators.admission import RUN_KEY, AdmitOperator


@dag(
    dag_id="scheduler_replay",
    schedule=None,
    catchup=False,
    max_active_runs=RUNS_IN_FLIGHT,  # as train_pipeline
    max_active_tasks=2 * RUNS_IN_FLIGHT,
    render_template_as_native_obj=True,
    tags=["trainyard", "benchmark"],
    doc_md=__doc__,
)
def scheduler_replay():
    admit = AdmitOperator(task_id="admit", spec="{{ dag_run.conf }}")
    train = HoldSlots(
        task_id="train",
        spec="{{ dag_run.conf }}",
        seconds="{{ dag_run.conf['hold_seconds'] }}",
        restart_seconds="{{ dag_run.conf.get('restart_seconds', 0) }}",
        run_key=RUN_KEY,
        pool="gpu-cpu",
        pool_slots=1,
    )
    admit >> train


scheduler_replay_dag = scheduler_replay()
