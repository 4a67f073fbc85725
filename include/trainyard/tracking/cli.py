"""``trainyard runs list`` and ``trainyard runs compare``: find, filter and compare training runs."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from trainyard.errors import cli_command


def _query(args, me):
    """The filters of ``args``, confined to the teams whose runs ``me`` may read."""
    from trainyard.tracking.runs import Query, parse_condition

    tags = dict(args.tag or [])
    for name, value in (
        ("dataset.commit", args.dataset_commit),
        ("dataset.repo", args.dataset),
        ("triggered_by", args.user),
    ):
        if value:
            tags[name] = value
    params = {name: value for name, value in (("recipe", args.recipe), ("resources.team", args.team)) if value}
    where = [parse_condition(text) for text in args.where or []]
    teams = None if me.admin else me.teams
    return Query(
        name=args.job, tags=tags, params=params, where=where, limit=args.limit, summaries=args.summaries, teams=teams
    )


def _print(header: list[str], rows: list[list[str]], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps([dict(zip(header, row, strict=True)) for row in rows], indent=1))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(header)
        writer.writerows(rows)
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
        for row in (header, *rows):
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


def cmd_runs_list(args) -> int:
    """Runs matching the filters, newest first (or the best one), with the params that differ and every
    metric."""
    from trainyard.acting import acting
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.tracking.runs import best, find, table_rows

    c, me = mt.client(), acting()
    if me.user is None:
        print(
            "trainyard: nobody is logged in, so no team's runs are shown: log in (AIRFLOW_API_TOKEN)", file=sys.stderr
        )  # noqa: E501
    runs = find(c, _query(args, me))
    if args.best:
        runs = [best(runs, args.best, args.lowest)]
    columns = args.columns.split(",") if args.columns else None
    header, rows = table_rows(runs, columns)
    _print(header, rows, args.format)
    if args.format == "table":
        print(f"({len(runs)} run(s))", file=sys.stderr)
    return 0


def cmd_runs_compare(args) -> int:
    """The runs named (or found by the filters) side by side: params (``*`` where they differ), metrics;
    with ``--curves``, a PNG of those metrics' curves, a line per run."""
    from trainyard.acting import acting
    from trainyard.teams import NotAllowed
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.tracking.runs import FilterError, Run, curves_png, find, side_by_side

    c, me = mt.client(), acting()
    if args.run_ids:
        runs = []
        for run_id in args.run_ids:
            run = c.get_run(run_id)
            runs.append(Run.of(run, c.get_experiment(run.info.experiment_id).name))
            if not me.may_read(runs[-1].team):
                raise NotAllowed(f"run {run_id} belongs to team {runs[-1].team!r}; {me.who()} may not read it")
    else:
        runs = find(c, _query(args, me))
    if not runs:
        raise FilterError("no run to compare: name run ids, or loosen the filters")
    lines = side_by_side(runs)
    if args.format == "table":
        _print(lines[0], lines[1:], "table")
    else:
        header = ["name", *[r.run_id for r in runs]]
        _print(header, [[line[0].strip().lstrip("* ").strip(), *line[1:]] for line in lines[1:]], args.format)
    if args.curves:
        out = curves_png(c, runs, args.curves.split(","), Path(args.png))
        print(f"curves of {args.curves} for {len(runs)} run(s): {out}", file=sys.stderr)
    return 0


def _tag(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: write a tag as NAME=VALUE")
    name, value = text.split("=", 1)
    return name.strip(), value.strip()


def add_tracking_commands(runs) -> None:
    """``list`` and ``compare`` under ``trainyard runs``: runs found in MLflow by what they trained on and how."""
    filters = argparse.ArgumentParser(add_help=False)
    f = filters.add_argument_group("filters (all must hold)")
    f.add_argument("--job", help="the job's name (its MLflow experiment); default: every job")
    f.add_argument("--recipe")
    f.add_argument("--team")
    f.add_argument("--user", help="who triggered the run")
    f.add_argument("--dataset", help="dataset repository")
    f.add_argument("--dataset-commit", help="dataset commit id (exact)")
    f.add_argument("--tag", action="append", type=_tag, metavar="NAME=VALUE", help="an equal tag (repeatable)")
    f.add_argument(
        "--where",
        action="append",
        metavar="COND",
        help=(
            "a param, metric or tag compared with < <= > >= = != ~ (prefix), numbers as numbers; "
            "alternatives joined by 'or': --where 'hyperparameters.learning_rate < 0.01' "
            "--where 'val_map > 0.5 or val_accuracy > 0.9' (repeatable)"
        ),
    )
    f.add_argument("--limit", type=int, default=50, help="look at the newest N runs (default 50)")
    f.add_argument("--summaries", action="store_true", help="include sweeps' summary runs")
    f.add_argument("--format", choices=["table", "json", "csv"], default="table")

    p = runs.add_parser("list", parents=[filters], help="runs that match, newest first")
    p.add_argument("--best", metavar="METRIC", help="only the run with the highest METRIC")
    p.add_argument("--lowest", action="store_true", help="with --best: the lowest instead (a loss)")
    p.add_argument("--columns", help="comma-separated params/metrics/tags to show (default: what differs, metrics)")
    p.set_defaults(func=cli_command(cmd_runs_list))

    p = runs.add_parser("compare", parents=[filters], help="runs side by side, their curves overlaid")
    p.add_argument("run_ids", nargs="*", help="runs to compare (default: those the filters find)")
    p.add_argument("--curves", metavar="METRICS", help="comma-separated metrics to draw, e.g. train_loss,val_accuracy")
    p.add_argument("--png", default="runs-compare.png", help="where --curves writes its PNG")
    p.set_defaults(func=cli_command(cmd_runs_compare))
