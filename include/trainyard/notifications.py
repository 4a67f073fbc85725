"""Notices: what a team hears about its runs and models, and where it hears it.

A :class:`Notice` is built here from plain facts (no Airflow): a run that failed, a gate that blocked a model
(with its table), a new ``staging`` or ``production`` version, a team past 80 % of its monthly budget. Each
team lists its targets in resources.yaml (``teams.<team>.notify``), Airflow connection ids, each optionally
for some kinds only; the Airflow side (``trainyard_airflow.notifications``) sends a notice to them by the
connection's type. Every notice is written to the task log too, so the default (no targets) is the log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

NoticeKind = Literal["run_failed", "gate_failed", "new_version", "budget_warning"]
NOTICE_KINDS: tuple[NoticeKind, ...] = ("run_failed", "gate_failed", "new_version", "budget_warning")
BUDGET_WARNING_FRACTION = 0.8  # the share of its monthly budget past which a team is told, once a month


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


def budget_warning_due(team: str, month: str, home: Path) -> bool:
    """True once per team and month, to the first caller to ask (a file created exclusively, so two
    trainings that end together cannot both send it)."""
    marker = home / "notifications" / f"budget-{team}-{month}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def targets(notify: Iterable[Any], kind: NoticeKind) -> list[str]:
    """The connection ids of a team's ``notify`` entries that take notices of ``kind``."""
    return [t.connection for t in notify if kind in t.kinds]
