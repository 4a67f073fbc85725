"""One error model for the library: every failure trainyard raises on purpose is a ``TrainyardError``.

``retryable`` says whether running the same step again may succeed (a lost connection, a busy lock, a
preempted node) or cannot (a bad JobSpec, data that fails its suite, a gate breach, a broken export).
The Airflow layer maps permanent errors to ``AirflowFailException`` in one place
(``trainyard_airflow.errors``); retryable ones stay ordinary exceptions, so the task's retries apply.
"""

from __future__ import annotations


class TrainyardError(Exception):
    """Base of every error trainyard raises on purpose; the message says what to do."""

    retryable: bool = False


class PermanentError(TrainyardError):
    """Running the step again with the same inputs fails the same way: fix the input."""

    retryable = False


class RetryableError(TrainyardError):
    """A transient condition (a lock, a connection, a preempted worker): a retry may succeed."""

    retryable = True


class NotFoundError(PermanentError, LookupError):
    """A named thing (dataset repository, ref, model version, file) does not exist."""


def spec_error_message(problems: list[str] | tuple[str, ...]) -> str:
    """The one format of a JobSpec error: a header, then one ``field: what is wrong`` line each."""
    return "invalid JobSpec:\n  " + "\n  ".join(problems)
