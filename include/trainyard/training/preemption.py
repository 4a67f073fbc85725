"""The word to checkpoint and stop (a preemption), as the workers hear it and agree on it.

A worker hears the word two ways: the file :data:`WORD_FILE` that the local launcher writes into the run's
work directory, or, where :data:`ON_SIGTERM_ENV` says so (a Kubernetes pod, whose eviction is SIGTERM;
torchrun forwards it), SIGTERM; a second SIGTERM ends the worker at once. (Locally the workers keep
SIGTERM's default: a launcher that stops them for good, or torchrun restarting a failed group, must not
wait for a step boundary that a rank stuck on a dead peer never reaches.) Ranks hear the word at different
moments; a rank that stopped alone would hang the others in their next collective. So each rank adds what it
heard to one all-reduced flag, on the CPU (a gloo group of its own where the training's is NCCL: reading it
never waits for the GPU), started after a step and read at the next check, and every rank stops at the same
step. A check every step cost the digits recipe's two CPU workers 12 % of their speed (a 7 ms step, a
collective of about 0.7 ms): after :data:`TIMED_STEPS` steps the ranks agree on a period of about
:data:`CHECK_EVERY_S` of steps (every step for a step that long), so the word is agreed within two periods. The loop
(:mod:`trainyard.training.loop`) then writes a checkpoint at that step, rank 0 writes :data:`STOPPED_FILE`,
and the workers end with status 0, or in a pod (SIGTERM heard) with 3 (``entry.STOPPED_ON_SIGTERM_EXIT``): a
stopped pod is never a finished one, and the nodes left of an elastic job start again without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trainyard.training.strategies.base import Strategy

WORD_FILE = "preempt"  # in the run's work directory: written by the launcher, read by every worker
STOPPED_FILE = "preempted.json"  # in the work directory: rank 0's record of the step it stopped at
# A worker's environment: the seconds between the word and the kill (a custom program's contract)
GRACE_ENV = "TRAINYARD_PREEMPTION_GRACE_S"
ON_SIGTERM_ENV = "TRAINYARD_STOP_ON_SIGTERM"  # "1": SIGTERM is the word too (the pods' environment)
LISTEN_EVERY_S = 0.5  # how often a worker looks for the word file
TIMED_STEPS = 16  # the steps each rank times before the ranks agree on the period of their checks
CHECK_EVERY_S = 0.1  # the period aimed at, in seconds of steps (at most MAX_CHECK_PERIOD steps)
MAX_CHECK_PERIOD = 64


class StopWord:
    """What a worker heard of the word, and what all of them agreed (:meth:`agreed`, every rank after every
    step). Listens from its creation until :meth:`close`: the word file in ``work_dir``, and SIGTERM where
    :data:`ON_SIGTERM_ENV` asks for it (in the main thread only; the handler it replaces comes back at
    ``close``). Made by every rank at the same point, after the process group exists."""

    def __init__(self, work_dir: str, strategy: Strategy) -> None:
        self.word = Path(work_dir) / WORD_FILE
        self.strategy = strategy
        self.heard = threading.Event()
        self.pending: Callable[[], torch.Tensor] | None = None  # the flag of the check before, being reduced
        self.steps = 0  # steps seen
        self.checks = 0  # checks started
        self.every = 1  # steps per check: 1 until the ranks have agreed on the period (TIMED_STEPS)
        self._started: float | None = None
        self._group = _cpu_group(strategy)
        self._closed = threading.Event()
        self._previous: Any = None
        if os.environ.get(ON_SIGTERM_ENV) == "1" and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._listener = threading.Thread(target=self._listen, name="trainyard-stop-word", daemon=True)
        self._listener.start()

    def _on_sigterm(self, signum, frame) -> None:
        if self.heard.is_set():  # told twice: the default, now (a rank stuck in a collective ends)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self.heard.set()

    def _listen(self) -> None:
        while not self._closed.wait(LISTEN_EVERY_S):
            if os.path.lexists(self.word):
                self.heard.set()
                return

    def agreed(self) -> bool:
        """Whether every rank stops after this step: any rank had heard the word by the check before. Every
        rank calls it after every step, in the same order as its other collectives."""
        heard = self.heard.is_set()
        if self.strategy.world == 1:
            return heard
        import torch  # imported by the worker long before: a lookup (this module is the launchers' too)

        self.steps += 1
        if self._started is None:
            self._started = time.perf_counter()
        elif self.steps == TIMED_STEPS:
            self._agree_on_the_period(time.perf_counter() - self._started)
        if self.steps % self.every:
            return False
        flag = torch.tensor([1.0 if heard else 0.0], dtype=torch.float32)  # on the CPU
        pending, self.pending = self.pending, self._start(flag)
        return pending is not None and float(pending()[0]) > 0

    def _agree_on_the_period(self, timed_s: float) -> None:
        """Every rank at the same step: the ranks' mean step time (the same number on every rank) sets the
        period of the checks."""
        import torch

        mean_s = float(self._start(torch.tensor([timed_s / (TIMED_STEPS - 1)], dtype=torch.float32))()[0])
        self.every = max(1, min(MAX_CHECK_PERIOD, math.ceil(CHECK_EVERY_S / max(mean_s, 1e-6))))

    def _start(self, t: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Start averaging ``t`` over the ranks (a flag's mean is above 0 where any rank heard); what waits
        for the mean."""
        self.checks += 1
        if self._group is None:  # the strategy's own collective (Horovod; gloo), under names of its own
            return self.strategy.start_mean(t, name=f"stop_word.{self.checks % 3}")
        import torch.distributed as dist

        work = dist.all_reduce(t, group=self._group, async_op=True)
        world = self.strategy.world
        return lambda: (work.wait(), t / world)[1]

    def close(self, drain: bool = True) -> None:
        """Stop listening; with ``drain``, wait for the flag still being reduced (no collective is left in
        flight; after a failure, when another rank may be gone, nothing is waited for)."""
        self._closed.set()
        if self.pending is not None and drain:
            self.pending()
        self.pending = None
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def _cpu_group(strategy: Strategy) -> Any:
    """A gloo group of every rank for the flag where the training's torch.distributed group is not gloo
    (NCCL: a flag on the GPU would make each read wait for the step), else None."""
    if strategy.world == 1:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def say_word(work_dir: str) -> None:
    """The launcher's word to the workers in ``work_dir``: an empty file, created without following a link
    that the workers may have left there (the launcher may be root)."""
    # said already, or something stands there: the workers see a name either way
    with contextlib.suppress(FileExistsError):
        os.close(os.open(Path(work_dir) / WORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


def record_stop(work_dir: str, step: int) -> None:
    """Rank 0, once the checkpoint at ``step`` is on disk: the record that the workers stopped on the word."""
    (Path(work_dir) / STOPPED_FILE).write_text(json.dumps({"step": step}))


def stopped_at(work_dir: str) -> int | None:
    """The step the workers stopped at on the word, or None if they did not: a launcher's question, once the
    workers have ended (the record is read as untrusted, as every file they leave)."""
    from trainyard.training.run_config import WorkerOutputError, open_untrusted

    try:
        with open_untrusted(Path(work_dir) / STOPPED_FILE) as fd:
            record = json.loads(os.pread(fd, 256, 0)) if fd is not None else None
    except (WorkerOutputError, ValueError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def regular_file(path: Path) -> os.stat_result | None:
    """``path``'s status where it is a regular file of its own (not a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def clear(work_dir: str) -> None:
    """Before a launch: no word and no record left by an earlier try."""
    for name in (WORD_FILE, STOPPED_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(Path(work_dir) / name)
