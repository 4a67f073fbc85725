"""One error model for the library: every failure trainyard raises on purpose is a ``TrainyardError``.

``retryable`` says whether running the same step again may succeed (a lost connection, a busy lock, a
preempted node) or cannot (a bad JobSpec, data that fails its suite, a gate breach, a broken export).
The Airflow layer maps permanent errors to ``AirflowFailException`` in one place
(``trainyard_airflow.errors``); retryable ones stay ordinary exceptions, so the task's retries apply.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable


class TrainyardError(Exception):
    """Base of every error trainyard raises on purpose; the message says what to do."""

    retryable: bool = False


class PermanentError(TrainyardError):
    """Running the step again with the same inputs fails the same way: fix the input."""

    retryable = False


class RetryableError(TrainyardError):
    """A transient condition (a lock, a connection, a preempted worker): a retry may succeed."""

    retryable = True


class Preempted(RetryableError):
    """The job was preempted: told to checkpoint and stop, its workers ended, at a checkpoint of the step
    they stopped at (``step``), or killed after the grace (their newest periodic checkpoint stands). Not a
    failure: the job waits for its GPUs again in its old place, and its next try resumes. (Uncaught, it is
    a retryable error: a retry resumes all the same.)"""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def is_permanent(err: BaseException) -> bool:
    """Whether ``err`` says a retry cannot help: a trainyard error that is not ``retryable``. The one
    definition: the Airflow layer fails such a task at once, and a training that ends with one gives its
    GPUs back at once."""
    return isinstance(err, TrainyardError) and not err.retryable


class NotFoundError(PermanentError, LookupError):
    """A named thing (dataset repository, ref, model version, file) does not exist."""


class DataFormatError(PermanentError, ValueError):
    """A dataset's files cannot be read as its layout says (a missing file, bad JSON, a wrong header); the
    message names the file and line. A ``ValueError`` too, for callers that catch bad input generally."""


def spec_error_message(problems: list[str] | tuple[str, ...]) -> str:
    """The one format of a JobSpec error: a header, then one ``field: what is wrong`` line each."""
    return "invalid JobSpec:\n  " + "\n  ".join(problems)


class CommandError(PermanentError):
    """A command-line command refused its input or failed for a reason its message explains; raised where
    a command turns another library's error (MLflow, signing) into the one line the CLI prints."""


EXIT_ERROR = 1  # a command's error; argparse keeps 2 for a command line it cannot parse


def expected_error(err: BaseException) -> bool:
    """Errors that are the user's input or the world, not a bug, so a command reports them as one line:
    trainyard's own; ValueError (bad input, an invalid JobSpec); OSError (a missing or unreadable file, an
    unreachable server), whose messages name the path or the address."""
    return isinstance(err, (TrainyardError, ValueError, OSError))


def cli_command(command: Callable, hint: Callable[[object, Exception], str] | None = None) -> Callable:
    """Wrap a CLI command ``command(args) -> int``: an expected error becomes the line
    ``trainyard: error: <message>`` on stderr (plus ``hint(args, err)``) and exit status EXIT_ERROR, with
    the traceback before it when ``args.debug`` is set; any other exception is a bug and keeps its
    traceback."""

    @functools.wraps(command)
    def run(args) -> int:
        try:
            return command(args)
        except Exception as err:
            if not expected_error(err):
                raise
            if getattr(args, "debug", False):  # parsers built without the global flag (tests) have none
                traceback.print_exc()
            print(f"trainyard: error: {err}{hint(args, err) if hint else ''}", file=sys.stderr)
            return EXIT_ERROR

    return run
