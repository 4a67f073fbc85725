"""How a sweep trial's workers and the task that launched them agree, at each epoch's end, whether the
trial goes on: two small files in the run's ``work`` directory, stdlib only (the workers import no Optuna
and never open the study, which the platform alone writes).

* rank 0 appends ``{"epoch": e, "value": v}`` to :data:`REPORTS` once the epoch's val metrics are in;
* the launching task (:class:`trainyard.sweeps.trials.Watcher`) reports it to the trial, asks the pruner,
  and writes its answer for that epoch to :data:`VERDICT` (replaced whole);
* rank 0 waits for the answer, and every rank learns it in one collective, so all of them stop at the same
  reporting point (a rank that went on alone would wait forever in its next all-reduce).

A custom program (``recipe: custom``) reports through its metrics file instead (the lines holding the
objective: :class:`trainyard.sweeps.trials.Watcher`), and the answers go to the same verdict file.

The workers are not trusted: what they report is read like their metrics file (no link followed, a bad
line fails the trial), and the trial's state is decided by the platform from its own pruner, not by what
the workers do with the answer; a worker that goes on after a stop is stopped (``Watcher``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path

REPORTS = "trial_reports.jsonl"  # the workers' objective at each epoch's end
VERDICT = "trial_verdict.json"  # the platform's answer to the newest report
VERDICT_WAIT_S = 120.0  # the longest rank 0 waits for an answer; then it goes on (and says so)
POLL_S = 0.02


def report(work_dir: str | Path, epoch: int, value: float) -> None:
    """Rank 0: the objective after ``epoch`` (1-based), one whole line."""
    line = json.dumps({"epoch": epoch, "value": value if math.isfinite(value) else None}) + "\n"
    with open(Path(work_dir) / REPORTS, "a", encoding="utf-8") as fh:
        fh.write(line)


def wait_verdict(work_dir: str | Path, epoch: int, timeout_s: float = VERDICT_WAIT_S) -> bool | None:
    """Rank 0: True to stop after ``epoch``, False to go on, None if no answer came within ``timeout_s``."""
    path = Path(work_dir) / VERDICT
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = json.loads(path.read_text(encoding="utf-8"))
            if int(answer["epoch"]) >= epoch:
                return bool(answer["prune"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not written yet, or being replaced
        time.sleep(POLL_S)
    return None


def write_verdict(work_dir: str | Path, epoch: int, prune: bool) -> None:
    """The platform: its answer for ``epoch``, replacing the last one whole (a temp file renamed over it:
    a link the workers left there is replaced, never followed). Readable by the workers' user, the only
    one that can reach the ``work`` directory."""
    work = Path(work_dir)
    fd, tmp = tempfile.mkstemp(dir=work, prefix=f".{VERDICT}.")  # O_EXCL: never a file the workers made
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)  # the task's umask is private; the workers may run as a sandbox user
            fh.write(json.dumps({"epoch": epoch, "prune": prune}).encode())
        os.replace(tmp, work / VERDICT)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
