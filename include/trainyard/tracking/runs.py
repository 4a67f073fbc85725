"""Runs found, filtered and compared: what ``trainyard runs list`` and ``runs compare`` answer.

MLflow's own filter is AND-only and compares a param only as text (``=``, ``!=``, ``LIKE``): no ``<``
at all, and as text ``'1e-05'`` sorts after ``'0.01'``. So MLflow is asked only for what it compares
exactly (the experiment, equal tags), newest first, at most ``limit`` runs; the conditions are then
applied here, numbers compared as numbers, each condition an ``or`` of alternatives, all conditions
together (``and``).

A condition names a param (``hyperparameters.learning_rate``), a metric (its latest value:
``val_accuracy``) or a tag (``dataset.commit``), then an operator and a value: ``<``, ``<=``, ``>``,
``>=``, ``=``, ``!=``, or ``~`` (the value is a prefix of it: a commit id's first characters).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.errors import PermanentError

SUMMARY_TAG = "sweep.summary"  # a sweep's summary run (not a training): left out unless asked for

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "=": operator.eq,
    "~": lambda have, prefix: str(have).startswith(str(prefix)),
}
CONDITION = re.compile(r"^\s*([\w.\-/ :]+?)\s*(<=|>=|!=|<|>|=|~)\s*(.+?)\s*$")


class FilterError(PermanentError, ValueError):
    """A condition that cannot be read or names nothing the runs have."""


@dataclass(frozen=True)
class Condition:
    name: str
    op: str
    value: str

    def holds(self, run: Run) -> bool:
        have = run.value(self.name)
        if have is None:
            return False
        if self.op == "~":
            return OPERATORS["~"](have, self.value)
        a, b = _number(have), _number(self.value)
        if a is not None and b is not None:  # numbers as numbers: 1e-05 < 0.01
            return OPERATORS[self.op](a, b)
        if self.op in ("=", "!="):
            return OPERATORS[self.op](str(have), self.value)
        raise FilterError(f"{self}: {have!r} and {self.value!r} are not both numbers; compare text with = != ~")

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.value}"


def parse_condition(text: str) -> list[Condition]:
    """``"val_map > 0.5 or val_accuracy > 0.9"``: its alternatives (any one of them holds)."""
    out = []
    for part in re.split(r"\s+or\s+", text.strip()):
        m = CONDITION.match(part)
        if not m:
            raise FilterError(
                f"cannot read {part!r}: write NAME OP VALUE, e.g. 'hyperparameters.learning_rate < 0.01' "
                "(OP: < <= > >= = != ~), alternatives joined by 'or'"
            )
        out.append(Condition(*m.groups()))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


@dataclass(frozen=True)
class Run:
    """One MLflow run as the commands show it."""

    run_id: str
    experiment: str
    name: str
    start: float  # epoch seconds
    status: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def team(self) -> str | None:
        """The team whose job made the run (a run from before the tag: its ``resources.team`` param)."""
        from trainyard.tracking.mlflow_auth import TEAM_TAG

        return self.tags.get(TEAM_TAG) or self.params.get("resources.team")

    def value(self, name: str) -> Any:
        for source in (self.metrics, self.params, self.tags):
            if name in source:
                return source[name]
        return None

    @classmethod
    def of(cls, run, experiment: str) -> Run:
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
        return cls(
            run_id=run.info.run_id,
            experiment=experiment,
            name=run.info.run_name or run.info.run_id,
            start=(run.info.start_time or 0) / 1000,
            status=run.info.status,
            params=dict(run.data.params),
            metrics=dict(run.data.metrics),
            tags=tags,
        )


@dataclass
class Query:
    """What to look for: a job's experiment (``name``, None: every job), equal tags and params pushed
    down to MLflow, the newest ``limit`` of those, then the ``where`` conditions (each a list of
    alternatives)."""

    name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # equal params, pushed down as well
    where: list[list[Condition]] = field(default_factory=list)
    limit: int = 50
    summaries: bool = False  # include sweeps' summary runs
    teams: tuple[str, ...] | None = None  # only these teams' runs (None: every team's)


def find(c, query: Query) -> list[Run]:
    """The runs that match ``query``, newest first; FilterError for a condition on a name none of the
    searched runs has (a typo would otherwise match nothing, silently)."""
    from trainyard.tracking.mlflow_tracking import quote

    experiments = c.search_experiments(filter_string=f"name = {quote(query.name)}" if query.name else None)
    if not experiments:
        raise FilterError(f"no job named {query.name!r} has runs" if query.name else "no runs yet")
    names = {e.experiment_id: e.name for e in experiments}
    pushed = [f"tags.`{k}` = {quote(v)}" for k, v in query.tags.items()]
    pushed += [f"params.`{k}` = {quote(v)}" for k, v in query.params.items()]
    found = c.search_runs(
        list(names),
        filter_string=" and ".join(pushed),
        # MLflow cannot ask for runs without a tag: a sweep's summary runs are dropped here, after the search
        max_results=query.limit if query.summaries else query.limit * 2 + 10,
        order_by=["attributes.start_time DESC"],
    )
    runs = [Run.of(r, names[r.info.experiment_id]) for r in found]
    if query.teams is not None:
        runs = [r for r in runs if r.team in query.teams]
    if not query.summaries:
        runs = [r for r in runs if r.tags.get(SUMMARY_TAG) != "true"]
    runs = runs[: query.limit]
    known = {n for r in runs for n in (*r.params, *r.metrics, *r.tags)}
    for alternatives in query.where:
        for cond in alternatives:
            if runs and cond.name not in known:
                close = sorted(n for n in known if cond.name.split(".")[-1] in n)[:8]
                raise FilterError(
                    f"{cond}: none of the {len(runs)} runs has a param, metric or tag {cond.name!r}"
                    + (f"; did you mean one of {close}?" if close else "")
                )
    return [r for r in runs if all(any(c.holds(r) for c in alternatives) for alternatives in query.where)]


def best(runs: Sequence[Run], metric: str, lowest: bool = False) -> Run:
    scored = [r for r in runs if _number(r.metrics.get(metric)) is not None]
    if not scored:
        raise FilterError(f"--best {metric}: none of the {len(runs)} runs found has that metric")
    pick = min if lowest else max
    return pick(scored, key=lambda r: r.metrics[metric])


def differing(runs: Sequence[Run]) -> set[str]:
    """The params whose values are not the same in every run."""
    names = {n for r in runs for n in r.params}
    return {n for n in names if len({r.params.get(n) for r in runs}) > 1}


def table_rows(runs: Sequence[Run], columns: Iterable[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """A header and one row per run: id, job, start, status, then ``columns`` (default: the params that
    differ, all of them for one run, and every metric the runs have)."""
    import time

    if columns is None:  # one run: all of its params
        diff = sorted(differing(runs)) if len(runs) > 1 else sorted({n for r in runs for n in r.params})
        metrics = sorted({m for r in runs for m in r.metrics})
        columns = [*diff, *metrics]
    columns = list(columns)
    header = ["run_id", "job", "started", "status", *columns]
    rows = []
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.start))
        values = [_cell(r.value(c)) for c in columns]
        rows.append([r.run_id, r.experiment, started, r.status, *values])
    return header, rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def side_by_side(runs: Sequence[Run]) -> list[list[str]]:
    """Params, then metrics, one line each, a column per run; a param that differs is marked ``*``."""
    diff = differing(runs)
    lines = [["", *[r.run_id[:12] for r in runs]]]
    for name in sorted({n for r in runs for n in r.params}):
        lines.append([("* " if name in diff else "  ") + name, *[_cell(r.params.get(name)) for r in runs]])
    for name in sorted({n for r in runs for n in r.metrics}):
        lines.append(["  " + name, *[_cell(r.metrics.get(name)) for r in runs]])
    return lines


def curves_png(c, runs: Sequence[Run], metrics: Sequence[str], path: Path) -> Path:
    """One panel per metric, a line per run (its whole history: value against step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(9, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        drawn = 0
        for r in runs:
            history = sorted(c.get_metric_history(r.run_id, metric), key=lambda m: (m.step, m.timestamp))
            if history:
                ax.plot([m.step for m in history], [m.value for m in history], label=f"{r.name} ({r.run_id[:8]})")
                drawn += 1
        ax.set_title(metric)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no run has this metric", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
