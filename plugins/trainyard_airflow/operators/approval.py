"""Approval of an alias move by another person than the requester, one the owning team allows.

Airflow's ``ApprovalOperator`` lets any user with the HITL permission answer, unless the task names its
``assigned_users``, whom the API server then holds to (HTTP 403 for anyone else). Who may approve is known
only when the run runs (the model's owning team, the requester), so this operator names them then, from the
``verify`` task's XCom (:func:`trainyard.teams.approvers`). When the answer comes back (from the API
server's record of who answered, not from an XCom a user could write) it is checked against the owning
team's policy as it is then (:func:`trainyard.teams.check_approval`), so a team open to everyone (no names
to assign) is held too, and recorded in the audit trail (:func:`approval_of`), from where ``move_alias``
reads it and checks it once more, with the version it approved.

``assigned_users`` are user ids as the auth manager knows them; under the simple auth manager (the
default) a user's id is their name, which is what resources.yaml lists. Under another auth manager whose ids
are not names, approvals must be given by an Airflow admin (``move_alias`` accepts any admin).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator


class TeamApprovalOperator(ApprovalOperator):
    """An ``ApprovalOperator`` whose respondents are the ``approvers`` that task ``verify_task`` returned."""

    def __init__(self, *, verify_task: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verify_task = verify_task

    def execute(self, context: Any) -> Any:
        from airflow.sdk.execution_time.hitl import HITLUser

        from trainyard.audit import AuditLog
        from trainyard.teams import NotAllowed

        verified = context["ti"].xcom_pull(task_ids=self.verify_task)
        approvers = verified["approvers"]
        if approvers is not None:
            if not approvers:
                raise NotAllowed(
                    f"nobody but {verified['requester']!r} may approve this move of a model of team "
                    f"{verified['owner']!r}: add another promoter to resources.yaml "
                    f"teams.{verified['owner']}.policy.promoters, or ask an Airflow admin"
                )
            self.assigned_users = [HITLUser(id=user, name=user) for user in approvers]
        self.log.info("approvers: %s", ", ".join(approvers) if approvers else f"anyone but {verified['requester']}")
        # what the approver is shown (the subject, rendered before this), where no user writes: the audit
        # trail; the approval is recorded against it, whatever verify's XCom says by then
        dag_run = context["dag_run"]
        AuditLog().append(
            APPROVAL_ASKED,
            dag_run.triggering_user_name or "scheduler",
            model=context["params"]["model"],
            alias=context["params"]["alias"],
            version=str(verified["version"]),
            dag_run=f"{dag_run.dag_id}/{dag_run.run_id}",
        )
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from trainyard.audit import AuditLog
        from trainyard.teams import NotAllowed
        from trainyard_airflow.auth import check_approver

        answer = super().execute_complete(context, event)  # a Reject fails the task here
        approver = (answer.get("responded_by_user") or {}).get("name")
        params, dag_run = context["params"], context["dag_run"]
        check_approver(params["model"], dag_run.triggering_user_name, approver)
        run = f"{dag_run.dag_id}/{dag_run.run_id}"
        asked = _last(APPROVAL_ASKED, run)
        if asked is None:
            raise NotAllowed(f"no record of what was put to the approver in {run}; trigger the move again")
        # the approval where the move reads it: the audit trail, which no user writes (an XCom they may)
        AuditLog().append(
            APPROVAL,
            str(approver),
            model=asked["model"],
            alias=asked["alias"],
            version=asked["version"],
            requester=dag_run.triggering_user_name,
            dag_run=run,
        )
        return answer


# The audit trail's entries of an approval: what the approver was asked (the version, as they were shown
# it), and the approval given (TeamApprovalOperator; read by approval_of)
APPROVAL_ASKED, APPROVAL = "approval_asked", "approval"


def _last(kind: str, dag_run: str) -> dict | None:
    from trainyard.audit import AuditLog

    found = [e for e in AuditLog().entries(kind) if e.get("dag_run") == dag_run]
    return found[-1] if found else None


def approval_of(dag_run: str) -> dict | None:
    """The approval given in run ``dag_run`` (``dag_id/run_id``), as the ``approve`` task recorded it from
    the API server's answer: its audit entry (``actor``: who approved; ``version``: what they were asked to
    approve, recorded before they were asked), or None."""
    return _last(APPROVAL, dag_run)


def approved_by(model: str, requester: str | None, dag_run: str, version: str) -> str:
    """Who approved run ``dag_run``'s move of ``model`` to ``version``, from the audit trail (never an
    XCom); NotAllowed unless that approval was recorded, of this version, by someone who may give it."""
    from trainyard.teams import NotAllowed
    from trainyard_airflow.auth import check_approver

    approval = approval_of(dag_run) or {}
    check_approver(model, requester, approval.get("actor"))
    if approval["version"] != str(version):
        raise NotAllowed(f"version {approval['version']} of {model!r} was approved in {dag_run}, not version {version}")
    return str(approval["actor"])
