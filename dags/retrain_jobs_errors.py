"""
Job files that cannot become DAGs: this file fails to import, and Airflow lists it among the DAG import
errors with the message of every broken job file (its path and each bad field), and, in Airflow's
multi-team mode, of every job file whose team has no DAG bundle to make its DAG in. It makes no DAG of its
own. The DAGs of the good job files are made by `retrain_jobs.py`, which this error leaves alone (an import
error on that file would mark all of its DAGs stale).
"""

from __future__ import annotations

from trainyard.retraining import JobFileError, jobs_folder, load_jobs_folder
from trainyard_airflow.team_dags import jobs_without_a_bundle

_jobs, _errors = load_jobs_folder()
_errors.update(jobs_without_a_bundle(_jobs))
if _errors:
    raise JobFileError(
        f"{len(_errors)} job file(s) in {jobs_folder()} made no DAG; fix them and they will:\n\n"
        + "\n\n".join(_errors.values())
    )
