"""``trainyard queue cancel``: take a job out of the queue and end its run, for a member of its team or an
Airflow admin.

Who asks is who Airflow says: the caller's API token (``AIRFLOW_API_TOKEN``, from ``POST /auth/token``)
names the user and their role. The team check reads those claims; Airflow checks the token itself when
the run is marked failed (``PATCH /api/v2/dags/{dag}/dagRuns/{run}``), so a forged token ends nothing.
Only then is the job's row released from the ledger (its slots and its place), and the act is an entry of
the audit trail. A task of the run that waits deferred is ended by Airflow with its run (its trigger's
``on_kill`` withdraws too).
"""

from __future__ import annotations

from urllib.parse import quote

from trainyard.airflow_api import token_claims
from trainyard.errors import CommandError, NotFoundError
from trainyard.scheduling.admission.ledger import Ledger
from trainyard.scheduling.resources import ResourcesConfig
from trainyard.teams import is_member


def cancel_run(
    ledger: Ledger, config: ResourcesConfig, dag_id: str | None, run_id: str, *, api_url: str, token: str
) -> str:
    """Release the run ``run_id`` of ``dag_id`` (None: whichever DAG's job it is) from the queue and mark it
    failed; what was done, one line."""
    import requests

    from trainyard.audit import AuditLog

    def of_run(job_id: str) -> bool:  # a job id is "<dag_id>/<run_id>"
        dag, _, run = job_id.partition("/")
        return run == run_id and dag_id in (None, dag)

    matching = [e for e in ledger.entries() if of_run(e.job.id)]
    if len(matching) > 1:
        raise CommandError(
            f"run {run_id} is queued in {', '.join(e.job.id.partition('/')[0] for e in matching)}: name the "
            "one with --dag"
        )
    entry = matching[0] if matching else None
    if entry is None:
        raise NotFoundError(
            f"run {run_id} is not in the queue (`trainyard queue` lists what is): a run that has not reached "
            "admit yet, or trains on Kubernetes, is ended in Airflow (mark the run failed)"
        )
    job_id = entry.job.id
    dag_id = job_id.split("/", 1)[0]
    claims = token_claims(token)
    user, role = claims["sub"], str(claims.get("role", "")).lower()
    if role != "admin" and not is_member(config, entry.job.team, user):
        raise CommandError(
            f"user {user!r} may not cancel run {job_id}: it is team {entry.job.team!r}'s job; a member of "
            "the team (resources.yaml) or an Airflow admin may"
        )
    url = f"{api_url.rstrip('/')}/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
    try:
        r = requests.patch(url, json={"state": "failed"}, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except requests.RequestException as err:
        raise CommandError(f"could not reach Airflow's API at {api_url} ({err}); set AIRFLOW_API_URL") from None
    if not r.ok:
        raise CommandError(f"Airflow refused to mark run {job_id} failed: HTTP {r.status_code} {r.text[:300]}")
    ledger.cancel(job_id, f"cancelled by {user} (trainyard queue cancel); trigger a new run to train it")
    AuditLog().append(
        "queue_cancel", user, team=entry.job.team, run=job_id, was="waiting" if entry.admitted is None else "admitted"
    )
    slots = f"{entry.job.slots} {entry.job.gpu_type} slot(s)"
    return f"cancelled {job_id}: its run is marked failed and its place ({slots}) released"
