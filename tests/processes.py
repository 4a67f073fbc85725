"""Functions run in processes of their own at once, as many trainers, tasks or users would: what the tests of
every write path under concurrent processes share."""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable, Sequence
from typing import Any


def _report(target: Callable[..., Any], index: int, args: tuple, out: Any) -> None:
    try:
        out.put((index, target(*args), None))
    except BaseException:  # noqa: BLE001 - told to the test, which fails naming it
        out.put((index, None, traceback.format_exc()))


def in_processes(target: Callable[..., Any], calls: Sequence[tuple], timeout: float = 300) -> list[Any]:
    """``target(*args)`` for each ``args`` of ``calls``, each in a fresh (spawned) process, all started at
    once; what each returned, in the order of ``calls``. An exception in one fails the test with its
    traceback; so does a process that dies without an answer or takes longer than ``timeout`` in all."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_report, args=(target, i, args, out)) for i, args in enumerate(calls)]
    for p in procs:
        p.start()
    answers: dict[int, Any] = {}
    try:
        while len(answers) < len(procs):
            try:
                index, value, error = out.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"{len(procs) - len(answers)} of {len(procs)} processes gave no answer within {timeout} s "
                    f"(exit codes {[p.exitcode for p in procs]})"
                ) from None
            if error is not None:
                raise AssertionError(f"process {index} ({target.__name__}{calls[index]}) failed:\n{error}")
            answers[index] = value
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return [answers[i] for i in range(len(procs))]
