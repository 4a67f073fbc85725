"""The one place where trainyard's error model meets Airflow's.

A trainyard error that is not ``retryable`` (a bad JobSpec, data that fails its suite, a gate breach, a rejected export,
a version whose signature does not verify) fails the same way however often it runs, so the task fails at
once with ``AirflowFailException``: no retries, the message as the reason. Anything else (a retryable
error, a crash) propagates unchanged and the task's retries apply.

Every task in ``dags/*.py`` is wrapped with :func:`fail_permanently`, instead of each task catching its own
errors.
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

                raise AirflowFailException(str(err)) from None  # the message says it all
            raise

    wrapper.maps_permanent_errors = True  # type: ignore[attr-defined]  # what the DAG integrity test looks for
    return wrapper  # type: ignore[return-value]
