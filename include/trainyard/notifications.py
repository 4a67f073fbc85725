"""Notices: what a team hears about its runs and models, and where it hears it.

A :class:`Notice` is built here from plain facts (no Airflow): a run that failed, a gate that blocked a model
(with its table), a new ``staging`` or ``production`` version, a team past 80 % of its monthly budget, a job
that has waited in the queue longer than ``scheduling.queue_wait_notice_minutes``, a training that has run
longer than its spec's ``resources.expected_hours``. Each
team lists its targets in resources.yaml (``teams.<team>.notify``), Airflow connection ids, each optionally
for some kinds only; the Airflow side (``trainyard_airflow.notifications``) sends a notice to them by the
connection's type. Every notice is written to the task log too, so the default (no targets) is the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

NoticeKind = Literal["run_failed", "gate_failed", "new_version", "budget_warning", "queue_wait", "long_training"]
NOTICE_KINDS: tuple[NoticeKind, ...] = get_args(NoticeKind)
BUDGET_WARNING_FRACTION = 0.8  # the share of its monthly budget past which a team is told, once a month

log = logging.getLogger(__name__)
NOTICE_JOIN_S = 30.0  # the longest a training's end waits for its long_training notice to go out


@dataclass(frozen=True)
class Notice:
    kind: NoticeKind
    team: str | None  # None: not known (a spec too broken to name one); the log only
    subject: str
    text: str  # plain text, several lines: what happened and what to look at
    facts: dict[str, Any] = field(default_factory=dict)  # the same as data, for a webhook's receiver

    def payload(self) -> dict[str, Any]:
        """The JSON a webhook receives: the notice, its facts at the top level."""
        notice = {k: v for k, v in asdict(self).items() if k != "facts"}
        return {"source": "trainyard", **notice, **self.facts}


def gate_table(result: dict) -> str:
    """A gate result (``combined_gate``'s: thresholds, then champion rules) as a fixed-width table, one
    check per row."""
    rows = [("kind", "metric", "value", "min", "max", "verdict")]
    for c in result["checks"]:
        value = "missing" if c.get("value") is None else f"{c['value']:.4g}"
        bound = [("-" if c.get(k) is None else f"{c[k]:g}") for k in ("min", "max")]
        if c["passed"]:
            verdict = "ok"
        elif c.get("margin") is None:
            verdict = "FAILED (not computed)"
        else:
            verdict = f"FAILED by {-c['margin']:.4g}"
        rows.append((c.get("kind", "threshold"), c["metric"], value, *bound, verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run_failed(team: str | None, job: str, run: str, task: str, error: str, url: str | None) -> Notice:
    first = (error or "no error message").strip().splitlines()[0][:500]
    return Notice(
        "run_failed",
        team,
        f"[trainyard] {job}: run failed at {task}",
        f"The run {run} of {job} failed at task {task}:\n  {first}" + (f"\nLog: {url}" if url else ""),
        {"job": job, "run": run, "task": task, "error": first, "url": url},
    )


def gate_failed(team: str | None, job: str, run: str, result: dict, url: str | None) -> Notice:
    return Notice(
        "gate_failed",
        team,
        f"[trainyard] {job}: the gate blocked the model",
        f"The model of {job} (run {run}) missed its gate; it was not exported or registered.\n\n"
        + gate_table(result)
        + (f"\n\nLog: {url}" if url else ""),
        {"job": job, "run": run, "gate": result, "url": url},
    )


def new_version(team: str | None, model: str, version: str, alias: str, by: str, reason: str) -> Notice:
    return Notice(
        "new_version",
        team,
        f"[trainyard] {model} version {version} is now {alias}",
        f"{model} version {version} is now '{alias}' ({reason}; by {by}).",
        {"model": model, "version": version, "alias": alias, "by": by, "reason": reason},
    )


def budget_warning(team: str, month: str, spent: float, budget: float) -> Notice:
    share = spent / budget if budget else 1.0
    return Notice(
        "budget_warning",
        team,
        f"[trainyard] team {team} has spent {share:.0%} of its {month} budget",
        f"Team {team} has spent {spent:.2f} of its monthly budget of {budget:.2f} in {month} ({share:.0%}). "
        "Jobs whose worst case exceeds what is left are refused (see `trainyard report cost`).",
        {"team": team, "month": month, "spent": round(spent, 4), "budget": budget},
    )


def duration(seconds: float) -> str:
    """``seconds`` as people say it: 0.4 s, 12 min, 3.5 h."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def queue_wait(team: str, job: str, run: str, waited_s: float, reason: str) -> Notice:
    return Notice(
        "queue_wait",
        team,
        f"[trainyard] {job}: waiting for its GPUs for {duration(waited_s)}",
        f"The run {run} of {job} has waited {duration(waited_s)} in the queue: {reason}.\n"
        "It keeps its place; `trainyard queue` shows the queue, `trainyard queue cancel` takes it out.",
        {"job": job, "run": run, "waited_s": round(waited_s, 1), "reason": reason},
    )


def long_training(team: str, job: str, run: str, trained_s: float, expected_hours: float, max_hours: float) -> Notice:
    return Notice(
        "long_training",
        team,
        f"[trainyard] {job}: training for {duration(trained_s)}, longer than the expected {expected_hours:g} h",
        f"The run {run} of {job} has trained for {duration(trained_s)} (all tries), longer than its "
        f"resources.expected_hours of {expected_hours:g} h. It goes on until it ends or reaches "
        f"resources.max_hours ({max_hours:g} h); `trainyard runs cancel` stops it.",
        {"job": job, "run": run, "trained_s": round(trained_s, 1), "expected_hours": expected_hours},
    )


def budget_warning_due(team: str, month: str, home: Path) -> bool:
    """True once per team and month, to the first caller to ask."""
    return due_once(home / "notifications" / f"budget-{team}-{month}")


def due_once(marker: Path) -> bool:
    """True to the first caller that asks for ``marker``, False to every later one, in any process (the
    file is created exclusively, so two tasks that ask together cannot both send the notice)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


@contextlib.contextmanager
def watch_training_time(
    expected_hours: float | None, earlier_s: float, marker: Path, tell: Callable[[float], None]
) -> Iterator[None]:
    """Around a training: once it has trained ``expected_hours`` (``earlier_s`` of its earlier tries
    included), ``tell(seconds trained)`` is called from a timer thread, once per ``marker`` (a retry that
    starts past the time does not tell again). Nothing when ``expected_hours`` is None. What ``tell``
    raises is logged: a notice must not stop the training."""
    if expected_hours is None:
        yield
        return
    started = time.monotonic()

    def fire() -> None:
        try:
            if not due_once(marker):
                return
        except OSError:
            log.exception("could not tell that the training runs longer than expected")
            return
        try:
            tell(earlier_s + time.monotonic() - started)
        except Exception:
            marker.unlink(missing_ok=True)  # not told: a retry past the time tells instead
            log.exception("could not tell that the training runs longer than expected")

    delay = expected_hours * 3600 - earlier_s
    timer = threading.Timer(max(0.0, delay), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        if delay > 0:  # a training that ends in time is not told; one past it already is, however short
            timer.cancel()
        timer.join(NOTICE_JOIN_S)  # a notice being sent as the training ends is sent, not cut off


def targets(notify: Iterable[Any], kind: NoticeKind) -> list[str]:
    """The connection ids of a team's ``notify`` entries that take notices of ``kind``."""
    return [t.connection for t in notify if kind in t.kinds]
