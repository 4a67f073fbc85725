"""The Fleet page in the Airflow UI: each GPU type's slots, who holds them, who waits and why, and each
team's quota, limits and budget. Served by Airflow's api-server (the plugin's FastAPI app, under
``/trainyard``), behind Airflow's own login, and shown in its navigation (``external_views``).

It reads what ``trainyard queue`` reads, through the same code (:mod:`trainyard.scheduling.fleet_view`), and each
team's month as ``trainyard report cost`` counts it: the ledger of this installation and its run records, as the
logged-in user may see them (another team's job as its team, GPUs and priority only; another team's spend not at
all). ``/trainyard/fleet.json`` is the same as JSON, for scripts.
"""

from __future__ import annotations

from html import escape
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

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


def _fleet(user: Any) -> dict[str, Any]:
    """The fleet as ``user`` (Airflow's, from the request's token) may see it, read as every command reads
    it (:meth:`trainyard.acting.Acting.of`)."""
    from trainyard.acting import Acting
    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.fleet_view import fleet
    from trainyard.scheduling.resources import resources_in_force

    config = resources_in_force()
    reader = Acting.of(user.get_name(), str(getattr(user, "role", "") or ""))
    return fleet(config, existing_ledger(config), reader)


@app.get("/fleet.json")
def fleet_json(user: AirflowUser) -> dict[str, Any]:
    return _fleet(user)


@app.get("/fleet", response_class=HTMLResponse)
def fleet_page(user: AirflowUser) -> str:
    return render(_fleet(user))


def _cells(values: list[Any], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{escape('' if v is None else str(v))}</{tag}>" for v in values) + "</tr>"


def _job_rows(jobs: list[dict[str, Any]]) -> str:
    rows = []
    for j in jobs:
        if "run" in j:
            rows.append(
                _cells(
                    [j["team"], j["user"] or "-", j["gpus"], j["priority"], j["waited_minutes"], j["run"], j["reason"]]
                )
            )
        else:  # another team's job: what everyone may see of it
            rows.append(_cells([j["team"], "-", j["gpus"], j["priority"], "-", "-", "(another team's job)"]))
    return "".join(rows)


def render(view: dict[str, Any]) -> str:
    """The Fleet page's HTML (every value escaped): a table per GPU type, then the teams."""
    header = ["team", "user", "GPUs", "priority", "waited (min)", "run", "why"]
    parts = ["<h1>Fleet</h1>"]
    for t in view["gpu_types"]:
        parts.append(
            f"<h2>{escape(t['gpu_type'])}: {t['in_use']} of {t['slots']} slots in use, {t['free']} free "
            f"({t['price_per_hour']:g} an hour a slot)</h2>"
        )
        for title, jobs in (("holding", t["holders"]), ("waiting", t["waiting"])):
            if jobs:
                parts.append(f"<h3>{title}</h3><table>{_cells(header, 'th')}{_job_rows(jobs)}</table>")
        if not t["holders"] and not t["waiting"]:
            parts.append("<p>no job holds or waits for it</p>")
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
        parts.append(_cells([team["team"], *limits, *money]))
    parts.append("</table>")
    head = f"<head><title>Fleet</title><style>{STYLE}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"
