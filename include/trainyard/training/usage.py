"""GPU time actually used by a run, summed over every try: the basis of ``run_cost``.

Each launch appends one record per try to ``<run_dir>/usage.jsonl`` when its workers stop (successfully
or not): when they really started and ended (for Kubernetes, the pods' running times, not their time in
a queue) and how many GPUs they held. A retry adds its own record instead of restarting the clock, so
the cost of a failed try is not lost. Appends of one short line with O_APPEND are atomic on POSIX, so
concurrent writers (the pods of a multi-node job) do not interleave.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

USAGE_FILE = "usage.jsonl"


def record_try(run_dir: str | Path, *, attempt: int, started: float, ended: float, gpus: int, where: str) -> None:
    """Append one try's usage: ``started``/``ended`` are epoch seconds; ``gpus`` held for that span."""
    if ended < started:
        raise ValueError(f"usage record ends ({ended}) before it starts ({started})")
    line = json.dumps({"attempt": attempt, "started": started, "ended": ended, "gpus": gpus, "where": where})
    fd = os.open(Path(run_dir) / USAGE_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def tries(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / USAGE_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gpu_seconds(run_dir: str | Path) -> float:
    """GPU-seconds of every recorded try of the run."""
    return sum((t["ended"] - t["started"]) * t["gpus"] for t in tries(run_dir))


def wall_seconds(run_dir: str | Path) -> float:
    return sum(t["ended"] - t["started"] for t in tries(run_dir))


def seconds_left(run_dir: str | Path, max_hours: float) -> float:
    """What is left of ``resources.max_hours`` after the run's recorded tries (0 when it is used up)."""
    return max(0.0, max_hours * 3600 - wall_seconds(run_dir))
