"""GPU time actually used by a run, summed over every try: the basis of ``run_cost``.

Each launch appends one record per try to ``<run_dir>/usage.jsonl`` when its workers stop (successfully
or not): when they really started and ended (for Kubernetes, the pods' running times, not their time in
a queue) and how many GPUs they held. A retry adds its own record instead of restarting the clock, so
the cost of a failed try is not lost. Appends of one short line with O_APPEND are atomic on POSIX, so
concurrent writers (the pods of a multi-node job) do not interleave.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

USAGE_FILE = "usage.jsonl"
log = logging.getLogger(__name__)


def _append_line(path: Path, line: str) -> None:
    """One line appended with a single O_APPEND write: concurrent writers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def month_of(ts: float) -> str:
    """'YYYY-MM' of an epoch time, in UTC: the month a try counts in."""
    return time.strftime("%Y-%m", time.gmtime(ts))


def record_try(
    run_dir: str | Path, *, attempt: int, started: float, ended: float, gpus: int, where: str, node: int = 0
) -> None:
    """Append one try's usage: ``started``/``ended`` are epoch seconds; ``gpus`` held for that span;
    ``node``: a node of a multi-node job launched by a task of its own records its own GPUs, and node 0's
    records are the job's tries (:func:`tries`). The try goes into its month's spend journal too, under the
    journal's lock: the one-time fill of the journal (``trainyard.scheduling.budgets``) sees either neither
    line or both, so no try is counted twice."""
    from trainyard.files import file_lock

    if ended < started:
        raise ValueError(f"usage record ends ({ended}) before it starts ({started})")
    run_dir = Path(run_dir)
    with file_lock(runs_root_of(run_dir) / SPEND_LOCK):
        _append_line(
            run_dir / USAGE_FILE,
            json.dumps(
                {"attempt": attempt, "started": started, "ended": ended, "gpus": gpus, "where": where}
                | ({"node": node} if node else {})
            ),
        )
        _journal_try(run_dir, ended=ended, gpu_seconds=(ended - started) * gpus)


# The spend journal: every try once more, in the month it ended, with its run's team and GPU type, so that
# the budget gate (every look of every waiting job) reads this month's lines instead of every run directory
# ever made. ``<runs root>/.spend/YYYY-MM.jsonl`` (a job name never starts with a dot); the run's own usage
# file stays the record of the run. A runs root from before the journal is filled from the usage files
# once, under the same lock that appends take (trainyard.scheduling.budgets).
SPEND_DIR = ".spend"
SPEND_LOCK = ".spend.lock"


def journal_dir(runs_root: Path) -> Path:
    return runs_root / SPEND_DIR


def runs_root_of(run_dir: Path) -> Path:
    """The runs root of a run directory, ``<runs root>/<job name>/<run>``."""
    return run_dir.parent.parent


def journal_line(run: str, team: str, gpu_type: str, ended: float, gpu_seconds: float) -> str:
    return json.dumps({"run": run, "team": team, "gpu_type": gpu_type, "ended": ended, "gpu_seconds": gpu_seconds})


def _journal_try(run_dir: Path, *, ended: float, gpu_seconds: float) -> None:
    """Append one try of the run in ``run_dir`` to its month's journal, if the journal exists (until then,
    filling it from the usage files counts this try). The caller holds the journal's lock."""
    from trainyard.spec import slot_type_of
    from trainyard.training.run_config import RUN_CONFIG_FILE

    journal = journal_dir(runs_root_of(run_dir))
    if not journal.is_dir():
        return
    try:
        resources = json.loads((run_dir / RUN_CONFIG_FILE).read_text())["spec"]["resources"]
    except (OSError, ValueError, KeyError) as err:  # its team is unknown: no budget can be charged
        log.warning("%s: try not counted against a team's budget (no readable run config: %s)", run_dir, err)
        return
    slots = slot_type_of(str(resources["gpu_type"]), resources.get("mig_profile"))
    line = journal_line(run_dir.name, str(resources["team"]), slots, ended, gpu_seconds)
    _append_line(journal / f"{month_of(ended)}.jsonl", line)


def read_usage(path: str | Path) -> list[dict]:
    """The try records of a usage file, each with numeric ``started``, ``ended`` and ``gpus``: the one
    reader of the format (cost, budgets, max_hours). A line that is no such record (torn by a full disk,
    edited by hand) is skipped with a warning naming the file and the line: one damaged run must not stop
    every job's validation, admission or training."""
    records = []
    for number, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            started, ended, gpus = float(record["started"]), float(record["ended"]), int(record["gpus"])
            if not (math.isfinite(started) and math.isfinite(ended) and started <= ended and gpus >= 0):
                raise ValueError(f"started {started}, ended {ended}, gpus {gpus}")
        except (ValueError, KeyError, TypeError, ArithmeticError) as err:
            log.warning("%s:%d: not a usage record, not counted (%s: %s)", path, number, type(err).__name__, err)
            continue
        records.append({**record, "started": started, "ended": ended, "gpus": gpus})
    return records


def records(run_dir: str | Path) -> list[dict]:
    """Every usage record of the run: each try's, and each of its other nodes' where a multi-node job's nodes
    were launched by tasks of their own."""
    path = Path(run_dir) / USAGE_FILE
    return read_usage(path) if path.exists() else []


def tries(run_dir: str | Path) -> list[dict]:
    """The run's tries: their records (node 0's of a multi-node job launched a task per node)."""
    return [r for r in records(run_dir) if not r.get("node")]


def gpu_seconds(run_dir: str | Path) -> float:
    """GPU-seconds of every recorded try of the run, on every node."""
    return sum((t["ended"] - t["started"]) * t["gpus"] for t in records(run_dir))


def wall_seconds(run_dir: str | Path) -> float:
    return sum(t["ended"] - t["started"] for t in tries(run_dir))


def seconds_left(run_dir: str | Path, max_hours: float) -> float:
    """What is left of ``resources.max_hours`` after the run's recorded tries (0 when it is used up)."""
    return max(0.0, max_hours * 3600 - wall_seconds(run_dir))
