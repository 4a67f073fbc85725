"""The Jobs and Fleet pages in the Airflow UI. Served by Airflow's api-server (the plugin's FastAPI app,
under ``/trainyard``), behind Airflow's own login, and shown in its navigation (``external_views``).

The Jobs page: the latest runs of the training DAGs that the logged-in user's teams own, each with job,
recipe, team, GPUs, state, place and reason while it waits, progress while it trains, cost so far, result
and links (:mod:`trainyard.jobs_view`; Airflow's own records are read here, from its database).

The Fleet page: each GPU type's slots, who holds them, who waits and why, and each team's quota, limits
and budget.

It reads what ``trainyard queue`` reads, through the same code (:mod:`trainyard.scheduling.fleet_view`), and each
team's month as ``trainyard report cost`` counts it: the ledger of this installation and its run records, as the
logged-in user may see them (another team's job as its team, GPUs and priority only; another team's spend not at
all). ``/trainyard/fleet.json`` is the same as JSON, for scripts.
"""

from __future__ import annotations

import logging
from html import escape
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

log = logging.getLogger(__name__)
app = FastAPI(title="trainyard pages", docs_url=None, redoc_url=None, openapi_url=None)
STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
)


BearerToken = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


async def _user(request: Request, bearer: BearerToken) -> Any:
    """The request's Airflow user, as Airflow's own routes find it (a bearer token, else the UI's cookie;
    401 without either): ``airflow.api_fastapi.core_api.security.get_user``, imported here because it
    weighs 0.66 CPU-s and only the api-server serves these routes."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)


AirflowUser = Annotated[Any, Depends(_user)]
TRAINING_XCOMS = ("validate_spec", "register")  # the tasks whose result a Jobs row shows


def _reader(user: Any) -> Any:
    """Who reads, as every command reads it (:meth:`trainyard.acting.Acting.of`)."""
    from trainyard.acting import Acting

    return Acting.of(user.get_name(), str(getattr(user, "role", "") or ""))


def airflow_runs(limit: int, dag_ids: list[str] | None) -> list[Any]:
    """The latest ``limit`` runs of the training DAGs ``dag_ids`` (None: every team's), newest first, with
    their tasks' states, the train task's start while it runs, and the XComs a row shows: three queries
    of Airflow's database."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import or_, select
    from sqlalchemy.orm import selectinload

    from trainyard.jobs_view import AirflowRun
    from trainyard.teams import TRAINING_DAG

    of_training = (
        DagRun.dag_id.in_(dag_ids)
        if dag_ids is not None
        else or_(
            DagRun.dag_id == TRAINING_DAG, DagRun.dag_id.like(TRAINING_DAG.replace("_", "\\_") + ".%", escape="\\")
        )
    )
    with create_session() as session:
        runs = session.scalars(
            select(DagRun)
            .where(of_training)
            .options(selectinload(DagRun.dag_run_note))
            .order_by(DagRun.id.desc())
            .limit(limit)
        ).all()
        listed = {(r.dag_id, r.run_id) for r in runs}
        tasks: dict[tuple[str, str], dict[str, str]] = {}
        training: dict[tuple[str, str], float] = {}
        of_runs = select(
            TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.state, TaskInstance.start_date
        ).where(TaskInstance.dag_id.in_({d for d, _ in listed}), TaskInstance.run_id.in_({r for _, r in listed}))
        for dag_id, run_id, task_id, state, started in session.execute(of_runs):
            if (dag_id, run_id) not in listed:
                continue
            states = tasks.setdefault((dag_id, run_id), {})
            if task_id not in states or state in ("running", "deferred"):  # a sweep's trials: the busy one
                states[task_id] = str(state) if state else "none"
            if task_id == "train" and state == "running" and started:
                training[(dag_id, run_id)] = started.timestamp()
        xcoms: dict[tuple[str, str, str], Any] = {}
        found = select(XComModel).where(
            XComModel.dag_run_id.in_([r.id for r in runs]),
            XComModel.key == "return_value",
            XComModel.task_id.in_(TRAINING_XCOMS),
        )
        for x in session.scalars(found):
            xcoms[(x.dag_id, x.run_id, x.task_id)] = XComModel.deserialize_value(x)
        return [
            AirflowRun(
                dag_id=r.dag_id,
                run_id=r.run_id,
                state=str(r.state),
                conf=r.conf if isinstance(r.conf, dict) else None,
                note=r.note,
                triggered_by=r.triggering_user_name,
                started=r.start_date.timestamp() if r.start_date else None,
                tasks=tasks.get((r.dag_id, r.run_id), {}),
                training_started=training.get((r.dag_id, r.run_id)),
                spec=_mapping(xcoms.get((r.dag_id, r.run_id, "validate_spec"))),
                registered=_mapping(xcoms.get((r.dag_id, r.run_id, "register"))),
            )
            for r in runs
        ]


def _mapping(value: Any) -> dict | None:
    return value if isinstance(value, dict) else None


def _ledger(config: Any) -> Any:
    """The admission ledger as the pages read it (read-only), or None where none was made yet or it is an
    earlier version's, which the next admission brings up to date: the page shows no queue meanwhile."""
    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.ledger_db import LedgerOutdated

    try:
        return existing_ledger(config)
    except LedgerOutdated as err:
        log.warning("the page shows no queue: %s", err)
        return None


def _jobs(user: Any, limit: int) -> list[dict[str, Any]]:
    """The Jobs page's rows as ``user`` may see them: the latest ``limit`` runs of their teams' jobs. The
    runs are read from their teams' own DAGs (and the one shared DAG of an installation without teams in
    Airflow, four times as many, since its runs are every team's) and held to the reader
    (:func:`trainyard.jobs_view.visible_runs`) before MLflow is asked about them."""
    from trainyard.jobs_view import job_rows, tracked_runs, visible_runs
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import TRAINING_DAG, training_dag
    from trainyard.tracking import mlflow_tracking as mt

    config = resources_in_force()
    reader = _reader(user)
    dag_ids = None if reader.admin else [TRAINING_DAG, *(training_dag(t) for t in reader.teams)]
    runs = visible_runs(airflow_runs(limit * 4, dag_ids), reader)[:limit]
    jobs: dict[str, list[str]] = {}
    for run in runs:
        name = (run.spec or run.conf or {}).get("name")
        if isinstance(name, str):
            jobs.setdefault(name, []).append(run.key)
    try:
        tracked = tracked_runs(mt.client(), jobs)
    except Exception as err:  # noqa: BLE001 - MLflow down: the page without progress, saying so
        log.warning("the Jobs page shows no MLflow runs: %s", err)
        tracked = {}
    return job_rows(runs, reader, config, _ledger(config), tracked)


@app.get("/jobs.json")
def jobs_json(user: AirflowUser, limit: int = 50) -> list[dict[str, Any]]:
    return _jobs(user, min(max(limit, 1), 500))


@app.get("/jobs", response_class=HTMLResponse)
def jobs_page(user: AirflowUser, limit: int = 50) -> str:
    return render_jobs(_jobs(user, min(max(limit, 1), 500)))


UTILISATION_HOURS = 24.0  # the Fleet page's window
OTHER_TEAMS = "other teams"  # what a reader sees of the teams they may not read, in the use of the fleet


def _utilisation(hours: float, reader: Any) -> tuple[Any, list[Any]]:
    """The fleet's use over the last ``hours`` from Airflow's task records, as ``trainyard report
    utilisation`` measures it (:mod:`trainyard.scheduling.utilisation`), and the allocations it counted, as
    ``reader`` may see them: the teams they may not read left out of the teams' figures and folded into one,
    :data:`OTHER_TEAMS`, in the allocations (a team's use over time at the prices on the page is its spend,
    which only its members see)."""
    import time

    from trainyard.scheduling.resources import resources_in_force
    from trainyard.scheduling.utilisation import allocations_from_airflow, report

    until = time.time()
    allocations = allocations_from_airflow(until - hours * 3600, until)
    used = report(resources_in_force(), allocations, until - hours * 3600, until)  # every team's, as they are
    used.teams = {team: figures for team, figures in used.teams.items() if reader.may_read(team)}
    return used, seen_by(reader, allocations)


def seen_by(reader: Any, allocations: list[Any]) -> list[Any]:
    """``allocations`` with the teams ``reader`` may not read as :data:`OTHER_TEAMS`."""
    import dataclasses

    return [a if reader.may_read(a.team) else dataclasses.replace(a, team=OTHER_TEAMS) for a in allocations]


def _fleet(user: Any) -> dict[str, Any]:
    """The fleet as ``user`` (Airflow's, from the request's token) may see it, with each pool's utilisation
    over the last day (the reader's teams by name, the others as one)."""
    from trainyard.scheduling.fleet_view import fleet
    from trainyard.scheduling.resources import resources_in_force

    config = resources_in_force()
    reader = _reader(user)
    view = fleet(config, _ledger(config), reader)
    try:
        used = _utilisation(UTILISATION_HOURS, reader)[0].as_dict()
    except Exception as err:  # noqa: BLE001 - the queue and the teams still show
        log.warning("the Fleet page shows no utilisation: %s: %s", type(err).__name__, err)
        return view
    view["utilisation"] = {"hours": UTILISATION_HOURS, **{k: used[k] for k in ("utilisation", "pools", "teams")}}
    return view


@app.get("/fleet.json")
def fleet_json(user: AirflowUser) -> dict[str, Any]:
    return _fleet(user)


@app.get("/fleet", response_class=HTMLResponse)
def fleet_page(user: AirflowUser) -> str:
    return render(_fleet(user))


@app.get("/fleet/utilisation.png")
def utilisation_chart(
    user: AirflowUser, hours: Annotated[float, Query(ge=0.1, le=744.0)] = UTILISATION_HOURS
) -> Response:
    """The slots allocated over the last ``hours`` (at most a month), stacked by team (the reader's, and the
    others as one), against the fleet's slots: ``trainyard report utilisation --png``'s chart."""
    import tempfile
    from pathlib import Path

    from trainyard.scheduling.utilisation import chart

    rep, allocations = _utilisation(hours, _reader(user))
    with tempfile.TemporaryDirectory() as tmp:
        png = chart(rep, allocations, Path(tmp) / "utilisation.png", title=f"GPU slots allocated, last {hours:g} h")
        return Response(png.read_bytes(), media_type="image/png")


def _money(amount: float) -> str:
    """An amount in resources.yaml's prices (a cost, a spend, a price an hour), as both pages show it."""
    return f"${amount:,.2f}"


def _cells(values: list[Any], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{escape('' if v is None else str(v))}</{tag}>" for v in values) + "</tr>"


def _job_rows(jobs: list[dict[str, Any]], *, waiting: bool) -> str:
    """A table's rows of holding or (``waiting``) waiting jobs; a waiting job's last cell is its start."""
    rows = []
    for j in jobs:
        if "run" in j:
            values = [j["team"], j["user"] or "-", j["gpus"], j["priority"], j["waited_minutes"], j["run"], j["reason"]]
        else:  # another team's job: what everyone may see of it
            values = [j["team"], "-", j["gpus"], j["priority"], "-", "-", "(another team's job)"]
        rows.append(_cells([*values, j.get("start") or "-"] if waiting else values))
    return "".join(rows)


def _host_table(hosts: list[dict[str, Any]]) -> str:
    """The worker hosts and their devices, each free or held (by a team's job; its run where it is the
    reader's); nothing where no host announces itself."""
    if not hosts:
        return ""
    rows = []
    for h in hosts:
        held = [
            f"{d['device']}: " + (d["run"] or f"a job of {d['team']}" if d["team"] else "free" if h["serving"] else "-")
            for d in h["devices"]
        ]
        state = "serving" if h["serving"] else "gone"
        rows.append(_cells([h["host"], h["gpu_type"], state, "; ".join(held) or "(no devices: CPU slots)"]))
    return f"<h2>Hosts</h2><table>{_cells(['host', 'GPU type', 'state', 'devices'], 'th')}{''.join(rows)}</table>"


def render(view: dict[str, Any]) -> str:
    """The Fleet page's HTML (every value escaped): a table per GPU type, then the hosts, then the teams."""
    header = ["team", "user", "GPUs", "priority", "waited (min)", "run", "why"]
    parts = ["<h1>Fleet</h1>"]
    for t in view["gpu_types"]:
        parts.append(
            f"<h2>{escape(t['gpu_type'])}: {t['in_use']} of {t['slots']} slots in use, {t['free']} free "
            f"({_money(t['price_per_hour'])} an hour a slot)</h2>"
        )
        for title, jobs in (("holding", t["holders"]), ("waiting", t["waiting"])):
            waiting = title == "waiting"
            if jobs:
                names = _cells([*header, "start"] if waiting else header, "th")
                parts.append(f"<h3>{title}</h3><table>{names}{_job_rows(jobs, waiting=waiting)}</table>")
        if not t["holders"] and not t["waiting"]:
            parts.append("<p>no job holds or waits for it</p>")
    parts.append(_host_table(view.get("hosts") or []))
    parts.append("<h2>Teams</h2><table>")
    parts.append(_cells(["team", "quota", "may borrow", "may lend", "spent", "committed", "budget", "left"], "th"))
    for team in view["teams"]:
        limits = [
            ", ".join(f"{k}: {v}" for k, v in team[f].items()) or "-"
            for f in ("quota", "borrowing_limit", "lending_limit")
        ]
        money = [
            team.get(k, "(not your team)" if k == "spent" else "") for k in ("spent", "committed", "budget", "left")
        ]
        money = [_money(v) if isinstance(v, int | float) else v for v in money]  # None: no budget, an empty cell
        parts.append(_cells([team["team"], *limits, *money]))
    parts.append("</table>")
    used = view.get("utilisation")
    if used:
        pools = ", ".join(f"{escape(name)} {p['utilisation']:.0%}" for name, p in used["pools"].items())
        parts.append(
            f"<h2>Utilisation, last {used['hours']:g} h: {used['utilisation']:.0%}</h2><p>{pools}</p>"
            '<img src="fleet/utilisation.png" alt="GPU slots allocated over that window, by team" width="900">'
        )
    head = f"<head><title>Fleet</title><style>{STYLE}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"


def _progress_words(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    words = f"epoch {p['epoch']}/{p['epochs']}"
    if p.get("samples_per_second") is not None:
        words += f", {p['samples_per_second']:g} samples/s"
    if p.get("eta_seconds") is not None:
        words += f", ETA {p['eta_seconds']} s"
    return words


def _link_cells(links: dict[str, str]) -> str:
    shown = [  # Airflow's own pages in the window the UI's frame is in; MLflow and TensorBoard in a new one
        f'<a href="{escape(url, quote=True)}" target="{"_top" if url.startswith("/") else "_blank"}">{escape(name)}</a>'
        for name, url in links.items()
        if url.startswith(("/", "http://", "https://"))
    ]
    return "<td>" + " ".join(shown) + "</td>"


def render_jobs(rows: list[dict[str, Any]]) -> str:
    """The Jobs page's HTML (every value escaped): a row per run."""
    header = ["run", "job", "recipe", "team", "GPUs", "state", "queue", "progress", "cost so far", "result", "links"]
    parts = ["<h1>Jobs</h1>", "<table>", _cells(header, "th")]
    for j in rows:
        queue = f"{j['place']}: {j['reason']}" if j.get("place") else (j.get("reason") or "")
        if j.get("start"):
            queue += f"; {j['start']}"
        gpus = f"{j['gpu_type']} x {j['gpus']}" if "gpus" in j else ""
        values = [
            j["run"].partition("/")[2], j.get("job"), j.get("recipe"), j.get("team"), gpus, j["stage"], queue,
            _progress_words(j.get("progress")), "" if j.get("cost") is None else _money(j["cost"]), j.get("result"),
        ]  # fmt: skip
        parts.append(_cells(values)[: -len("</tr>")] + _link_cells(j["links"]) + "</tr>")
    parts.append("</table>")
    if not rows:
        parts.append("<p>no run of your teams' jobs yet</p>")
    head = f"<head><title>Jobs</title><style>{STYLE}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"
