"""
### promote_model

Point an alias of a registered model (`staging`, `production`) at a verified version, or roll it back:

`verify` → `needs_approval` → `approve` (when the owning team's policy asks) → `move_alias`

In Airflow's multi-team mode each team has its own `promote_model.<team>` (its bundle, as for
`train_pipeline.<team>`), which moves the aliases of the team's models only: its runs, logs and approvals
are seen by the team's members and admins only. Only a promoter of the team that owns the model
(resources.yaml `teams.<team>.policy.promoters`; absent: every member) or an Airflow admin may move its
aliases: `verify` fails the run naming who may. Whether a move
waits for approval is the owning team's policy (`policy.approval`, by default `[production]`), not the
requester's choice. `approve` then waits (up to 24 h) under "Required actions" (or
`PATCH .../taskInstances/approve/-1/hitlDetails`) for another promoter or an admin: Airflow answers anyone
else, the requester included, with HTTP 403. Reject or no answer fails the run.

`verify` downloads every file of the version and checks it against the Ed25519-signed SHA-256 manifest
stored with it; a changed, missing or extra file, or a bad signature, fails the run there. `move_alias`
checks the requester and the approver again, verifies again (the files may have changed while waiting),
moves the alias and appends the move to the audit trail (`trainyard models history <model>`; who = the user
who triggered the run, `approved_by` = who approved). `action: rollback` with no version moves the alias
back to the version that held it before (`trainyard models rollback` triggers this).

The verify key comes from the connection `trainyard_signing` (extra `{"verify_key": "<PEM>"}` or
`{"verify_key_path": "/path.pem"}`), else `$TRAINYARD_VERIFY_KEY`, else `$TRAINYARD_HOME/keys/verify_key.pem`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from trainyard.teams import PROMOTE_DAG, team_dag
from trainyard_airflow.auth import triggering_user
from trainyard_airflow.errors import fail_permanently
from trainyard_airflow.notifications import TeamNotifier
from trainyard_airflow.operators.approval import TeamApprovalOperator
from trainyard_airflow.team_dags import bundle_team, makes_dags

# In Airflow's multi-team mode this file is read in every team's bundle and makes that team's own
# promote_model.<team> there, for its models only; in the shared bundle it makes nothing (team_dags).
TEAM = bundle_team(__file__)

CONN_ID = "trainyard_signing"
APPROVAL_TIMEOUT = timedelta(hours=24)

# the model's team hears of a failed promotion and of an alias that moved (resources.yaml teams.*.notify)
default_args = {
    "owner": "trainyard",
    "retries": 1,
    "retry_delay": timedelta(seconds=10),
    "on_failure_callback": [TeamNotifier(event="failure")],
}


def _trusted_keys():
    """The trusted verify keys: the Airflow connection's key if there is one, else the environment's or the
    keyring in $TRAINYARD_HOME/keys (trainyard.registry.signing.trusted_keys)."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    from trainyard.registry.signing import trusted_keys

    try:
        extra = Connection.get(CONN_ID).extra_dejson or {}
    except AirflowNotFoundException:
        return trusted_keys()
    return trusted_keys(extra.get("verify_key") or extra.get("verify_key_path"))


# -- the tasks; promote_model() below wires them with the approval between ------------------------------
# one XCom per task, its record (multiple_outputs=False: see train_pipeline.py)
@task(multiple_outputs=False)
@fail_permanently
def verify(params: dict | None = None) -> dict:
    """Check that the requester may move the model's aliases, then re-hash every file of the version
    and check the signed manifest; either failing fails the run."""
    assert params is not None  # Airflow passes the run's params by name
    from trainyard import teams
    from trainyard.registry.versions import alias_holder, resolve_version, rollback_target, verify_version
    from trainyard.tracking.mlflow_tracking import client
    from trainyard_airflow.auth import admins, authorize_move

    c, model, alias, requester = client(), params["model"], params["alias"], triggering_user()
    config, owner = authorize_move(model, requester, TEAM)
    if params["action"] == "rollback":
        version = rollback_target(c, model, alias, params["version"])
    else:
        version = resolve_version(c, model, params["version"])
    info = verify_version(c, model, version, _trusted_keys())
    return {
        **info,
        "alias": alias,
        "current": alias_holder(c, model, alias),
        "owner": owner,
        "requester": requester,
        "approval": teams.needs_approval(config, owner, alias),
        "approvers": teams.approvers(config, owner, str(requester), admins()),
    }


@task.branch
@fail_permanently
def needs_approval(verified: dict) -> str:
    """`approve` if the owning team's policy asks for a second person on this alias, else `move_alias`."""
    return "approve" if verified["approval"] else "move_alias"


@task(
    multiple_outputs=False,
    trigger_rule="none_failed_min_one_success",
    on_success_callback=[TeamNotifier(event="promoted")],
)
@fail_permanently
def move_alias(verified: dict, params: dict | None = None) -> dict:
    """Check the requester (and the approver) again, verify again, move the alias, append
    who/when/from/to/why to the audit trail."""
    assert params is not None  # Airflow passes the run's params by name
    from trainyard import teams
    from trainyard.registry.versions import promote
    from trainyard.tracking.mlflow_tracking import client
    from trainyard_airflow.auth import authorize_move
    from trainyard_airflow.operators.approval import approved_by

    ctx = get_current_context()
    dag_run = ctx["dag_run"]
    model, alias, requester = params["model"], params["alias"], triggering_user()
    # the owner and the policy as they are now (it may have changed while the move waited), not as
    # verify's XCom says: a user may write XComs
    config, owner = authorize_move(model, requester, TEAM)
    run_key = f"{dag_run.dag_id}/{dag_run.run_id}"
    extra: dict[str, str | None] = {"dag_run": run_key, "team": owner}
    if teams.needs_approval(config, owner, alias):
        extra["approved_by"] = approved_by(model, requester, run_key, verified["version"])
    return promote(
        client(),
        model,
        verified["version"],
        alias,
        user=str(requester),
        reason=params["reason"],
        trusted=_trusted_keys(),
        action=params["action"],
        extra=extra,
        expected_holder=verified["current"],
    )


@dag(
    dag_id=team_dag(PROMOTE_DAG, TEAM),
    schedule=None,
    catchup=False,
    max_active_runs=16,  # moves of one alias are serialized by promote()'s lock, not by queueing every team
    default_args=default_args,
    tags=["trainyard", "registry", *([f"team:{TEAM}"] if TEAM else [])],
    doc_md=__doc__,
    params={
        "model": Param("digits", type="string", minLength=1, description="Registered model name."),
        "version": Param(
            "",
            type="string",
            description="Version to move to; empty: the one under `staging` (promote), the one before (rollback).",
        ),
        "alias": Param("production", enum=["staging", "production"], description="Alias to move."),
        "reason": Param("", type="string", minLength=1, description="Why (recorded in the alias history)."),
        "action": Param("promote", enum=["promote", "rollback"], description="A promotion, or a rollback."),
    },
)
def promote_model():
    approve = TeamApprovalOperator(
        task_id="approve",
        verify_task="verify",
        subject=(
            "{{ params.action | capitalize }}: move {{ params.alias }} of {{ params.model }} to version "
            "{{ ti.xcom_pull(task_ids='verify')['version'] }}?"
        ),
        body=(
            "Currently `{{ params.alias }}` = version {{ ti.xcom_pull(task_ids='verify')['current'] }}.\n\n"
            "Version {{ ti.xcom_pull(task_ids='verify')['version'] }} verified: "
            "{{ ti.xcom_pull(task_ids='verify')['files'] }} files, manifest "
            "`{{ ti.xcom_pull(task_ids='verify')['manifest_sha256'] }}`, key "
            "`{{ ti.xcom_pull(task_ids='verify')['key_id'] }}`.\n\nReason: {{ params.reason }}\n\n"
            "Requested by {{ ti.xcom_pull(task_ids='verify')['requester'] }}; the model belongs to team "
            "{{ ti.xcom_pull(task_ids='verify')['owner'] }}."
        ),
        defaults="Reject",  # no answer within response_timeout = Reject = failed run, alias unchanged
        response_timeout=APPROVAL_TIMEOUT,
        fail_on_reject=True,
        retries=0,  # a retry would ask again; a new run is the way to ask again
    )

    # A task call returns an XComArg at parse time; the task it is passed to receives the JSON it stands for
    # at run time. `Any` says both to mypy, which still checks each call's arguments by count and name.
    verified: Any = verify()
    branch = needs_approval(verified)
    moved = move_alias(verified)
    verified >> branch >> [approve, moved]
    approve >> moved


if makes_dags(TEAM):
    promote_model_dag = promote_model()  # not `dag`: that is the decorator's name

if __name__ == "__main__":
    promote_model_dag.test()
