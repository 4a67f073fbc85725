"""Functions run in processes of their own at once, as many trainers, tasks or users would: what the tests of
every write path under concurrent processes share."""

from __future__ import annotations

import multiprocessing
import queue
import time
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
    once; what each returned, in the order of ``calls``. The test fails, saying why, where one raised (its
    traceback), died without an answer, did not exit with 0, or all took longer than ``timeout`` seconds."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_report, args=(target, i, args, out)) for i, args in enumerate(calls)]
    for p in procs:
        p.start()
    answers: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(answers) < len(procs):
            try:
                index, value, error = out.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                died = [i for i, p in enumerate(procs) if i not in answers and p.exitcode not in (None, 0)]
                late = time.monotonic() >= deadline
                if died or late:
                    why = f"process(es) {died} died without an answer" if died else f"no answer within {timeout} s"
                    raise AssertionError(f"{why} (exit codes {[p.exitcode for p in procs]})") from None
                continue
            if error is not None:
                raise AssertionError(f"process {index} ({target.__name__}{calls[index]}) failed:\n{error}")
            answers[index] = value
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs), [p.exitcode for p in procs]
    return [answers[i] for i in range(len(procs))]
