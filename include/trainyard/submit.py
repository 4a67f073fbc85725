"""``trainyard submit`` and ``trainyard runs status|logs|cancel``: a job's Airflow run from a terminal,
through Airflow's REST API and its official client (``apache-airflow-client``), as the user of the
command line's Airflow login (:mod:`trainyard.airflow_api`).

``submit`` validates the JobSpec here first (what can be checked without the worker: fields, the team's
policy and budget as this machine sees them), triggers its team's training DAG (:func:`find_training_dag`:
``train_pipeline.<team>`` in Airflow's multi-team mode, else ``train_pipeline``) with it as the run's conf, and
with ``--wait`` follows the run: each task's state as it changes, the job's place in the queue while it
waits for GPUs, and the admission and training tasks' logs as they are written. It exits 0 only if the
run succeeded.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from trainyard.errors import CommandError, NotFoundError
from trainyard.teams import TRAINING_DAG, team_dag

STREAMED = ("admit", "train", "train_kubernetes", "trial.admit", "trial.train_trial")  # their logs are followed
ENDED = ("success", "failed")


def _api_errors() -> tuple[type[Exception], ...]:
    import airflow_client.client as af
    from urllib3.exceptions import HTTPError

    return af.ApiException, HTTPError


def _refused(err: Exception, doing: str) -> CommandError:
    status = getattr(err, "status", None)
    body = str(getattr(err, "body", "") or err)[:500]
    return CommandError(f"{doing}: Airflow answered {f'HTTP {status}: ' if status else ''}{body}")


def find_team_dag(client: Any, name: str, team: str) -> str:
    """``team``'s own DAG ``name`` (multi-team mode), else the one ``name`` of every team, whichever this
    login may see; CommandError saying which is missing or refused."""
    import airflow_client.client as af

    statuses = {}
    for dag_id in (team_dag(name, team), name):
        try:
            af.DAGApi(client).get_dag(dag_id)
            return dag_id
        except af.ApiException as err:
            statuses[dag_id] = err.status
        except _api_errors() as err:
            raise _refused(err, f"could not look up {dag_id}") from None
    if statuses[team_dag(name, team)] == 403:
        raise CommandError(
            f"this Airflow login may not use team {team!r}'s {team_dag(name, team)} (HTTP 403): the team's "
            "members (resources.yaml) and admins may"
        )
    raise CommandError(
        f"Airflow has no {name} DAG for team {team!r} ({team_dag(name, team)} nor {name}): is team {team!r} in "
        "resources.yaml, and has Airflow read the team's bundle (`make setup`, then restart)?"
    )


def find_training_dag(client: Any, team: str) -> str:
    """The training DAG of ``team``'s jobs that this login may trigger (:func:`find_team_dag`)."""
    return find_team_dag(client, TRAINING_DAG, team)


def find_run_dag(client: Any, run_id: str) -> str:
    """The training DAG, of those this login may see, that has run ``run_id``; NotFoundError if none."""
    import airflow_client.client as af

    found = []
    try:
        dags = af.DAGApi(client).get_dags(dag_id_pattern=TRAINING_DAG, limit=1000).dags
        for dag in dags:
            if dag.dag_id != TRAINING_DAG and not dag.dag_id.startswith(TRAINING_DAG + "."):
                continue
            try:
                af.DagRunApi(client).get_dag_run(dag.dag_id, run_id)
                found.append(str(dag.dag_id))
            except af.ApiException as err:
                if err.status != 404:
                    raise
    except _api_errors() as err:
        raise _refused(err, f"could not look for run {run_id}") from None
    if len(found) > 1:
        raise CommandError(f"run {run_id} is a run of {', '.join(found)}: name the one with --dag")
    if found:
        return found[0]
    raise NotFoundError(
        f"no training run {run_id} that this Airflow login may see (another team's run is not shown); "
        "name its DAG with --dag"
    )


def trigger(client: Any, conf: dict, dag_id: str, note: str | None = None) -> str:
    """Start a run of ``dag_id`` with ``conf`` (``note``: the run's note, what Airflow's pages list it by);
    its run id."""
    import airflow_client.client as af

    body = af.TriggerDAGRunPostBody(logical_date=None, conf=conf, note=note)
    try:
        run = af.DagRunApi(client).trigger_dag_run(dag_id, body)
    except _api_errors() as err:
        raise _refused(err, f"could not trigger {dag_id}") from None
    return str(run.dag_run_id)


def run_state(client: Any, dag_id: str, run_id: str) -> tuple[str, dict[str, dict]]:
    """The run's state and its task instances (``task_id`` or ``task_id[map_index]`` -> state, try)."""
    import airflow_client.client as af

    try:
        run = af.DagRunApi(client).get_dag_run(dag_id, run_id)
        tis = af.TaskInstanceApi(client).get_task_instances(dag_id, run_id, limit=1000).task_instances
    except _api_errors() as err:
        raise _refused(err, f"could not read run {dag_id}/{run_id}") from None
    tasks = {}
    for ti in tis:
        index = -1 if ti.map_index is None else ti.map_index
        tasks[ti.task_id if index < 0 else f"{ti.task_id}[{index}]"] = {
            "task_id": ti.task_id,
            "map_index": index,
            "state": _text(ti.state),
            "try_number": ti.try_number or 0,
        }
    return _text(run.state), tasks


def _text(state: Any) -> str:
    return "none" if state is None else str(getattr(state, "value", state))


class LogFollower:
    """New lines of task logs since the last look, per task try. Airflow 3.3 answers a log request with the
    whole log so far (its continuation token does not skip what a finished task's earlier answer held), so
    the lines already shown are counted and skipped here."""

    def __init__(self, client: Any, dag_id: str, run_id: str):
        self.client, self.dag_id, self.run_id = client, dag_id, run_id
        self.shown: dict[tuple[str, int, int], int] = {}

    def new_lines(self, task_id: str, map_index: int, try_number: int) -> list[str]:
        import airflow_client.client as af

        key = (task_id, map_index, try_number)
        try:
            got = af.TaskInstanceApi(self.client).get_log(
                dag_id=self.dag_id,
                dag_run_id=self.run_id,
                task_id=task_id,
                try_number=try_number,
                map_index=map_index,
                full_content=True,
                accept="application/json",
            )
        except _api_errors():
            return []  # not written yet: the next look
        content = _without_sources(list(getattr(got.content, "actual_instance", got.content) or []))
        new = content[self.shown.get(key, 0) :]
        self.shown[key] = len(content)
        return [_line(m) for m in new]


SOURCES_GROUP = "::group::Log message source details"


def _without_sources(content: list) -> list:
    """A log answer (the client's anyOf wrapper unwrapped by the caller) less the group naming where its
    lines were read from: the api-server lists more sources while a task runs (its worker's log server)
    than after it ended, and a line counted in it would hide a line of the task's own."""
    events = [m if isinstance(m, str) else getattr(m, "event", "") for m in content]
    if SOURCES_GROUP not in events:
        return content
    start = events.index(SOURCES_GROUP)
    end = events.index("::endgroup::", start) if "::endgroup::" in events[start:] else start
    return content[:start] + content[end + 1 :]


def _line(message: Any) -> str:
    if isinstance(message, str):
        return message
    event = getattr(message, "event", "")
    stamp = getattr(message, "timestamp", None)
    return f"[{stamp:%H:%M:%S}] {event}" if stamp else str(event)


def follow(
    client: Any,
    dag_id: str,
    run_id: str,
    out: TextIO = sys.stderr,
    poll_s: float = 5.0,
    queue_place: Callable[[str], str | None] | None = None,
    streamed: tuple[str, ...] = STREAMED,
) -> str:
    """Print the run's task states as they change, the job's place in the queue while it waits, and the
    ``streamed`` tasks' new log lines, until the run ends; its final state."""
    seen: dict[str, tuple[str, int]] = {}
    logs = LogFollower(client, dag_id, run_id)
    job = f"{dag_id}/{run_id}"
    last_place = None
    while True:
        state, tasks = run_state(client, dag_id, run_id)
        for name, ti in tasks.items():
            now = (ti["state"], ti["try_number"])
            if seen.get(name) != now and ti["state"] != "none":
                tried = f" (try {ti['try_number']})" if ti["try_number"] > 1 else ""
                print(f"{name}: {ti['state']}{tried}", file=out, flush=True)
            seen[name] = now
            if (
                ti["task_id"] in streamed
                and ti["try_number"] > 0
                and ti["state"] not in ("none", "scheduled", "queued")
            ):
                for line in logs.new_lines(ti["task_id"], ti["map_index"], ti["try_number"]):
                    print(f"  {name} | {line}", file=out, flush=True)
        place = queue_place(job) if queue_place else None
        if place and place != last_place:
            print(f"queue: {place}", file=out, flush=True)
        last_place = place
        if state in ENDED:
            failed = [n for n, ti in tasks.items() if ti["state"] == "failed"]
            print(f"run {job}: {state}" + (f" (failed: {', '.join(failed)})" if failed else ""), file=out)
            return state
        time.sleep(poll_s)


def submit(
    client: Any,
    login_url: str,
    conf: dict,
    dag_id: str,
    wait: bool,
    poll_s: float,
    streamed: tuple[str, ...] = STREAMED,
    note: str | None = None,
) -> tuple[str, str | None]:
    """Trigger a run with ``conf`` and ``note`` (printing its id on stdout, its page on stderr) and, with
    ``wait``, follow it to its end, with the ``streamed`` tasks' logs: (run id, final state or None).
    ``trainyard submit``, ``trainyard replay`` and ``trainyard models promote|rollback``."""
    run_id = trigger(client, conf, dag_id, note)
    print(f"triggered {dag_id} run {run_id} ({login_url}/dags/{dag_id}/runs/{run_id})", file=sys.stderr)
    print(run_id, flush=True)
    if not wait:
        return run_id, None
    return run_id, follow(client, dag_id, run_id, poll_s=poll_s, queue_place=local_queue_place, streamed=streamed)


def local_queue_place(job: str) -> str | None:
    """Where ``job`` stands in this host's admission queue (the embedded profile: the ledger is a file of
    ``TRAINYARD_HOME``), in the words ``trainyard queue`` uses; None when it is not waiting there."""
    import os

    from trainyard.scheduling.admission.ledger import existing_ledger, place_in_queue
    from trainyard.scheduling.ledger_db import DatabaseUnavailable

    if not os.environ.get("TRAINYARD_HOME"):
        return None
    try:
        ledger = existing_ledger()
        return None if ledger is None else place_in_queue(ledger, job)
    except DatabaseUnavailable as err:  # e.g. an earlier version's ledger, until the next admission: said once
        return f"its place unknown: {err}"


def cancel(client: Any, dag_id: str, run_id: str) -> None:
    """Mark the run failed (as its user in the UI would): its running tasks are stopped, a job waiting
    for admission leaves the queue."""
    import airflow_client.client as af

    try:
        af.DagRunApi(client).patch_dag_run(dag_id, run_id, af.DAGRunPatchBody(state=af.DagRunMutableStates.FAILED))
    except _api_errors() as err:
        raise _refused(err, f"could not cancel run {dag_id}/{run_id}") from None
