"""The one place where trainyard's error model meets Airflow's.

A trainyard error that is not ``retryable`` (a bad JobSpec, data that fails its suite, a gate breach, a rejected export,
a version whose signature does not verify) fails the same way however often it runs, so the task fails at
once with ``AirflowFailException``: no retries, the message as the reason. Anything else (a retryable
error, a crash) propagates unchanged and the task's retries apply.

Every task in ``dags/*.py`` is wrapped with :func:`fail_permanently`, instead of each task catching its own
errors. A team check's refusal is also written to the audit trail there, whichever task made it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from trainyard.errors import is_permanent

F = TypeVar("F", bound=Callable[..., Any])


def fail_permanently(fn: F) -> F:
    """Decorate a task function (under ``@task``): a permanent error fails the task without retries.

    ``functools.wraps`` keeps the signature, so Airflow still injects ``params`` and other context."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if is_permanent(err):
                from airflow.sdk.exceptions import AirflowFailException

                _audit_if_refused(err)
                raise AirflowFailException(str(err)) from None  # the message says it all
            raise

    wrapper.maps_permanent_errors = True  # type: ignore[attr-defined]  # what the DAG integrity test looks for
    return wrapper  # type: ignore[return-value]


def _audit_if_refused(err: Exception) -> None:
    """A team check's refusal (:class:`trainyard.teams.NotAllowed`: another team's model, experiment,
    dataset, alias move or approval) in the audit trail: who tried what, in which run."""
    from trainyard.teams import NotAllowed

    if not isinstance(err, NotAllowed):
        return
    from airflow.sdk import get_current_context

    from trainyard.audit import AuditLog
    from trainyard_airflow.auth import triggering_user

    dag_run = get_current_context()["dag_run"]
    AuditLog().append(
        "ownership_refusal",
        triggering_user() or "scheduler",
        dag_run=f"{dag_run.dag_id}/{dag_run.run_id}",
        refused=str(err),
    )
