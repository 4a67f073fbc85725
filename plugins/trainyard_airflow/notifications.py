"""Notifiers: a task's end, told to its team through the Airflow connections its resources.yaml entry names.

Each is an Airflow ``BaseNotifier`` used as a task callback, so it runs in the task's own process once the
task has ended (a failure: only when no retry is left). What it tells is built by ``trainyard.notifications``;
here it is read from the task's context and sent by the provider notifier of each target connection's type:
``http`` (a JSON webhook, ``HttpNotifier``), ``smtp`` (``SmtpNotifier``) or ``slackwebhook``
(``SlackWebhookNotifier``). Nothing a run supplies is rendered as a template: the providers' ``notify`` is
called directly, with the text as data.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any, Literal

from airflow.sdk import BaseNotifier

from trainyard.notifications import Notice

log = logging.getLogger(__name__)

Event = Literal["failure", "registered", "promoted", "training_ended"]


def send(notice: Notice, context: Any) -> int:
    """Log ``notice``, then send it to each of its team's targets for its kind; a target that cannot be
    reached is logged and the others still get it. Returns how many targets took it."""
    from trainyard.notifications import targets
    from trainyard.scheduling.resources import load_resources

    log.info("notice (%s): %s\n%s", notice.kind, notice.subject, notice.text)
    team = load_resources().teams.get(notice.team) if notice.team else None
    sent = 0
    for conn_id in targets(team.notify, notice.kind) if team else []:
        try:
            _provider_notifier(conn_id, notice).notify(context)
            sent += 1
        except Exception:
            log.exception("could not send the %s notice to connection %r", notice.kind, conn_id)
    return sent


def long_training_marker(key: str) -> Path:
    """The file whose existence says the training ``key`` has had its ``long_training`` notice."""
    import hashlib

    from trainyard import paths

    return paths.home() / "notifications" / "long_training" / hashlib.sha256(key.encode()).hexdigest()


def tell_long_training(spec: Any, run: str, trained_s: float, context: Any) -> None:
    """Tell ``spec``'s team that the training ``run`` has trained ``trained_s`` seconds, past its
    ``resources.expected_hours`` (the caller made sure it is once)."""
    from trainyard import notifications

    res = spec.resources
    send(notifications.long_training(res.team, spec.name, run, trained_s, res.expected_hours, res.max_hours), context)


def training_time_watch(spec: Any, key: str, run: str, earlier_s: float, context: Any) -> Any:
    """A context manager around a training (``run``, known to the ledger as ``key``; ``spec`` a JobSpec):
    once it has trained its ``resources.expected_hours``, ``earlier_s`` of earlier tries included, its team
    is told (notice ``long_training``), once per ``key``."""
    from trainyard import notifications

    def tell(trained_s: float) -> None:
        tell_long_training(spec, run, trained_s, context)

    return notifications.watch_training_time(spec.resources.expected_hours, earlier_s, long_training_marker(key), tell)


def _provider_notifier(conn_id: str, notice: Notice) -> BaseNotifier:
    from airflow.sdk import Connection

    conn = Connection.get(conn_id)
    if conn.conn_type == "http":
        from airflow.providers.http.notifications.http import HttpNotifier

        return HttpNotifier(
            http_conn_id=conn_id,
            json=notice.payload(),
            headers={"Content-Type": "application/json"},
            extra_options={"timeout": 10},  # a receiver that hangs must not hold the task's worker
        )
    if conn.conn_type in ("smtp", "email"):
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        to = conn.extra_dejson.get("to")
        if not to:
            raise ValueError(f"connection {conn_id!r} (smtp) names no recipients: set its extra's 'to'")
        body = f"<pre>{html.escape(notice.text)}</pre>"
        return SmtpNotifier(to=to, subject=notice.subject, html_content=body, smtp_conn_id=conn_id)
    if conn.conn_type == "slackwebhook":
        from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

        return SlackWebhookNotifier(slack_webhook_conn_id=conn_id, text=f"*{notice.subject}*\n```{notice.text}```")
    raise ValueError(
        f"connection {conn_id!r} is of type {conn.conn_type!r}; trainyard notifies http (a JSON webhook), smtp "
        "and slackwebhook connections"
    )


class TeamNotifier(BaseNotifier):
    """Tells the run's team about the end of the task it is a callback of, by ``event``:

    - ``failure`` (on_failure_callback): the run failed at this task; at the ``gate`` task, the gate blocked
      the model, with its table;
    - ``registered`` / ``promoted`` (on_success_callback of ``register`` / ``move_alias``): a new ``staging``
      or ``production`` (or any alias) version;
    - ``training_ended`` (both callbacks of a training task): the team has spent 80 % of its monthly budget
      (told once per team and month).
    """

    def __init__(self, *, event: Event, team: str | None = None):
        """``team``: whom to tell, where the DAG itself knows it (a retraining job's, from its job file)."""
        super().__init__()
        self.event, self.team = event, team

    def notify(self, context: Any) -> None:
        notice = getattr(self, f"_{self.event}")(context)
        if notice is not None:
            send(notice, context)

    def _failure(self, context: Any) -> Notice:
        from trainyard import notifications

        ti, run = context["ti"], context["dag_run"]
        job, team = _job_and_team(context)
        team = self.team or team
        run_name = f"{run.dag_id}/{run.run_id}"
        url = getattr(ti, "log_url", None)
        gate = ti.xcom_pull(task_ids="gate", key="gate_result") if ti.task_id == "gate" else None
        if gate and not gate.get("passed", True):
            return notifications.gate_failed(team, job, run_name, gate, url)
        return notifications.run_failed(team, job, run_name, ti.task_id, str(context.get("exception") or ""), url)

    def _registered(self, context: Any) -> Notice:
        from trainyard import notifications

        ti, run = context["ti"], context["dag_run"]
        info = ti.xcom_pull(task_ids=ti.task_id)
        _, team = _job_and_team(context)
        by = getattr(run, "triggering_user_name", None) or run.dag_id
        return notifications.new_version(
            team, info["name"], str(info["version"]), "staging", by, f"registered by {run.dag_id}/{run.run_id}"
        )

    def _promoted(self, context: Any) -> Notice | None:
        from trainyard import notifications
        from trainyard.tracking.mlflow_tracking import client

        ti = context["ti"]
        moved = ti.xcom_pull(task_ids=ti.task_id)
        if not moved or not moved.get("changed"):
            return None  # the alias already pointed there: nothing new
        version = client().get_model_version(moved["model"], moved["to_version"])
        team = (version.tags or {}).get("team")
        return notifications.new_version(
            team, moved["model"], str(moved["to_version"]), moved["alias"], moved["user"], moved["reason"]
        )

    def _training_ended(self, context: Any) -> Notice | None:
        import time

        from trainyard import notifications, paths
        from trainyard.scheduling.admission.ledger import existing_ledger
        from trainyard.scheduling.budgets import month_of, team_standing
        from trainyard.scheduling.resources import load_resources

        _, team = _job_and_team(context)
        fleet = load_resources()
        if team not in fleet.teams or fleet.teams[team].monthly_budget is None:
            return None
        month = month_of(time.time())
        standing = team_standing(fleet, team, existing_ledger(fleet), month)
        budget = standing.budget or 0.0
        if standing.spent < notifications.BUDGET_WARNING_FRACTION * budget:
            return None
        if not notifications.budget_warning_due(team, month, paths.home()):
            return None
        return notifications.budget_warning(team, month, standing.spent, budget)


def _job_and_team(context: Any) -> tuple[str, str | None]:
    """The run's job name and team: the team of its validated spec, or of the model a ``promote_model``
    run moves (its versions' ``team`` tag). None before a spec was validated: a conf may name any team,
    and another team's targets must not hear what it wrote (the failure still goes to the task log)."""
    ti, run = context["ti"], context["dag_run"]
    spec = ti.xcom_pull(task_ids="validate_spec") or {}
    model = (context.get("params") or {}).get("model")
    job = spec.get("name") or model or (run.conf or {}).get("name") or run.dag_id
    if spec:
        return str(job), spec["resources"]["team"]
    return str(job), _model_team(model) if model else None


def _model_team(model: str) -> str | None:
    """The team of a registered model's newest version (its ``team`` tag), or None."""
    from trainyard.registry.mlflow_registry import newest_version
    from trainyard.tracking.mlflow_tracking import client

    try:
        version = newest_version(client(), model)
    except Exception:  # noqa: BLE001 - no such model, registry down: the log only
        return None
    return (version.tags or {}).get("team") if version is not None else None
