"""Every training run says which job it is: Airflow's pages list a run by its note, and a run triggered from
the trigger form or the REST API has none (``trainyard submit``, ``trainyard replay`` and the retraining
jobs write one when they trigger). As the scheduler starts such a run, this listener gives it its JobSpec's
headline (:func:`trainyard.form.run_note`: "digits: digits_cnn on 2 x cpu, team default"); a note someone
wrote is kept, and a conf the JobSpec refuses gets none (its first task says why)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    """Called by the scheduler as it starts a run, in its session: the note is written with the run."""
    from trainyard.form import run_note
    from trainyard.teams import TRAINING_DAG

    if dag_run.dag_id.partition(".")[0] != TRAINING_DAG or dag_run.note:
        return
    try:
        note = run_note(dag_run.dag_id, dag_run.conf)
    except Exception:  # a note is worth no run: the scheduler goes on without one
        log.exception("no note for run %s of %s", dag_run.run_id, dag_run.dag_id)
        return
    if note:
        dag_run.note = note
