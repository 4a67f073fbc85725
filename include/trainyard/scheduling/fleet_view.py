"""The fleet and its queue as a reader sees them: what ``trainyard queue`` prints and the Fleet page of the
Airflow UI shows (``trainyard_airflow.pages``), from one place.

A job is shown in full (its run, user, wait and reason) to its team's members and admins; to anyone else
as its team, GPUs, priority and state only (:data:`trainyard.teams.SEEN_BY_OTHERS`). Teams' quotas and
limits are the inventory's (resources.yaml, which every user may read); a team's spend and budget only
to its members and admins.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.acting import Acting
    from trainyard.scheduling.admission.ledger import Ledger
    from trainyard.scheduling.admission.policy import Entry, Verdict
    from trainyard.scheduling.admission.starts import StartEstimate
    from trainyard.scheduling.resources import ResourcesConfig


def queue_jobs(
    rows: list[tuple[Entry, Verdict]],
    reader: Acting,
    now: float | None = None,
    starts: dict[str, StartEstimate] | None = None,
) -> list[dict[str, Any]]:
    """The ledger's live jobs (``Ledger.standing``'s rows: admitted first, then the waiting in the order the
    policy looks at them) as ``reader`` may see them; a waiting job with its place among those waiting for
    its GPU type ("2 of 3") and, where ``starts`` is given, when it starts (epoch seconds; None: none in
    sight): ``starts_by`` the latest, ``expected_start`` and ``start_band`` (earliest, latest likely) the
    estimate from the ledger's history, and ``start`` all of it in words."""
    from trainyard.scheduling.admission.ledger import queue_places
    from trainyard.scheduling.admission.starts import start_in_words
    from trainyard.teams import SEEN_BY_OTHERS

    now = time.time() if now is None else now
    places = queue_places([e for e, _ in rows])
    jobs = []
    for e, verdict in rows:
        job: dict[str, Any] = {
            "run": e.job.id,
            "gpu_type": e.job.gpu_type,
            "state": "waiting" if e.admitted is None else "admitted",
            "team": e.job.team,
            "user": e.job.user,
            "gpus": e.job.slots,
            "priority": e.job.priority,
            "waited_minutes": round(((e.admitted or now) - e.waiting_from) / 60, 1),
            "reason": verdict.message,
            # what a program compares: why it waits, or that it is being preempted
            "why": verdict.reason.value if verdict.reason else _preempted_word(verdict),
        }
        if e.admitted is None:
            job["place"] = "{} of {}".format(*places[e.job.id])
        if starts is not None and e.admitted is None:
            start = starts.get(e.job.id)
            job["starts_by"] = start and start.latest
            job["expected_start"] = start and start.expected
            job["start_band"] = [start.early, start.late] if start and start.early is not None else None
            job["start"] = start_in_words(start, now)
        jobs.append(job if reader.may_read(e.job.team) else {k: job[k] for k in SEEN_BY_OTHERS})
    return jobs


def _preempted_word(verdict: Verdict) -> str | None:
    from trainyard.scheduling.admission.policy import Standing

    return Standing.PREEMPTED.value if verdict.standing is Standing.PREEMPTED else None


def live_queue(ledger: Ledger | None, reader: Acting) -> list[dict[str, Any]]:
    """This installation's queue (``ledger``: None where nothing was ever queued) as ``reader`` sees it."""
    from trainyard import paths
    from trainyard.scheduling.admission.ledger import starts_of
    from trainyard.scheduling.budgets import current_spend

    if ledger is None:
        return []
    spend = current_spend(ledger.config, paths.runs_root())
    rows = ledger.standing(spend)
    now = ledger.now()
    return queue_jobs(rows, reader, now, starts_of(ledger, [e for e, _ in rows], now, spend))


GONE_SHOWN_S = 3600.0  # a host gone this long is not shown (pods named anew at each start would pile up)


def hosts(ledger: Ledger | None, reader: Acting) -> list[dict[str, Any]]:
    """Per worker host and GPU type it announced (``trainyard worker``): whether it serves now, and each of
    its devices with the job that holds it (its team; its run where ``reader`` may read the team); a host
    gone for :data:`GONE_SHOWN_S` is left out. Empty where no host announces itself (one host, nothing
    routed)."""
    if ledger is None:
        return []
    now = ledger.now()
    admitted = [e for e in ledger.entries() if e.admitted is not None]
    holders = {(e.host, d): e.job for e in admitted for d in e.devices}
    for e in (e for e in admitted if e.job.nodes > 1):  # each node's devices, on its own host
        holders.update({(host, d): e.job for host, devices in ledger.node_devices(e.job.id).values() for d in devices})
    rows = []
    for record in ledger.hosts():
        if now - record.seen_until > GONE_SHOWN_S:
            continue
        devices = []
        for device in record.devices:
            job = holders.get((record.host, device))
            team = job.team if job is not None else None
            run = job.id if job is not None and reader.may_read(job.team) else None
            devices.append({"device": device, "team": team, "run": run})
        rows.append({"host": record.host, "gpu_type": record.gpu_type, "serving": record.live(now), "devices": devices})
    return rows


def fleet(config: ResourcesConfig, ledger: Ledger | None, reader: Acting) -> dict[str, Any]:
    """Per GPU type its slots, the slots admitted jobs hold, who holds them and who waits, and why; per worker
    host its types and devices and who holds each (:func:`hosts`); per team its quota and limits, and, where
    ``reader`` may read the team, this month's spend against its budget."""
    from trainyard import paths
    from trainyard.scheduling.budgets import month_of, team_months

    jobs = live_queue(ledger, reader)
    types = []
    for name, gpu in config.slot_types.items():
        held = [j for j in jobs if j["gpu_type"] == name and j["state"] == "admitted"]
        in_use = sum(j["gpus"] for j in held)
        types.append(
            {
                "gpu_type": name,
                "slots": gpu.slots,
                "in_use": in_use,
                "free": max(gpu.slots - in_use, 0),
                "price_per_hour": gpu.price_per_hour,
                "holders": held,
                "waiting": [j for j in jobs if j["gpu_type"] == name and j["state"] == "waiting"],
            }
        )
    months = team_months(config, month_of(time.time()), paths.runs_root(), ledger)
    teams = []
    for name, team in config.teams.items():
        row: dict[str, Any] = {
            "team": name,
            "quota": team.quota,
            "borrowing_limit": team.borrowing_limit,
            "lending_limit": team.lending_limit,
        }
        if reader.may_read(name):
            month = months[name]
            row.update(
                month=month.month, spent=round(month.spent, 2), committed=round(month.committed, 2),
                budget=month.budget, left=None if month.left is None else round(month.left, 2),
            )  # fmt: skip
        teams.append(row)
    return {"gpu_types": types, "hosts": hosts(ledger, reader), "teams": teams}
