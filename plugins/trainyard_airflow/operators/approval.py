"""Approval of an alias move by another person than the requester, one the owning team allows.

Airflow's ``ApprovalOperator`` lets any user with the HITL permission answer, unless the task names its
``assigned_users``, whom the API server then holds to (HTTP 403 for anyone else). Who may approve is known
only when the run runs (the model's owning team, the requester), so this operator names them then, from the
``verify`` task's XCom (:func:`trainyard.teams.approvers`). When the answer comes back (from the API
server's record of who answered, not from an XCom a user could write) it is checked against the owning
team's policy as it is then (:func:`trainyard.teams.check_approval`), so a team open to everyone (no names
to assign) is held too, and ``move_alias`` checks it once more.

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
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from trainyard_airflow.auth import check_approver

        answer = super().execute_complete(context, event)  # a Reject fails the task here
        approver = (answer.get("responded_by_user") or {}).get("name")
        check_approver(context["params"]["model"], context["dag_run"].triggering_user_name, approver)
        return answer
