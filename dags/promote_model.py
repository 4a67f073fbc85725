"""
### promote_model

Point an alias of a registered model (`staging`, `production`) at a verified version:

`verify` → `needs_approval` → `approve` (only if `require_approval`) → `move_alias`

`verify` downloads every file of the version and checks it against the Ed25519-signed SHA-256 manifest
stored with it; a changed, missing or extra file, or a bad signature, fails the run there. With
`require_approval`, `approve` waits (up to 24 h) for a person to answer Approve/Reject under
"Required actions" (or `PATCH .../taskInstances/approve/-1/hitlDetails`); Reject or no answer fails the
run. `move_alias` verifies again (the files may have changed while waiting), moves the alias and appends
the move to the alias history (`trainyard models history <model>`; who = the user who triggered the run).

The verify key comes from the connection `trainyard_signing` (extra `{"verify_key": "<PEM>"}` or
`{"verify_key_path": "/path.pem"}`), else `$TRAINYARD_VERIFY_KEY`, else `$TRAINYARD_HOME/keys/verify_key.pem`.
Rollback is the CLI's `trainyard models rollback <model>`, or this DAG with the version to go back to.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from trainyard_airflow.errors import fail_permanently
from trainyard_airflow.notifications import TeamNotifier

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


@dag(
    dag_id="promote_model",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # alias moves one at a time, so each history entry's from_version is exact
    default_args=default_args,
    tags=["trainyard", "registry"],
    doc_md=__doc__,
    params={
        "model": Param("digits", type="string", minLength=1, description="Registered model name."),
        "version": Param("", type="string", description="Version to promote; empty = the version under `staging`."),
        "alias": Param("production", enum=["staging", "production"], description="Alias to move."),
        "reason": Param("", type="string", minLength=1, description="Why (recorded in the alias history)."),
        "require_approval": Param(False, type="boolean", description="Wait for a person to approve the move."),
    },
)
def promote_model():
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    @task
    @fail_permanently
    def verify(params: dict | None = None) -> dict:
        """Re-hash every file of the version and check the signed manifest; a mismatch fails the run."""
        assert params is not None  # Airflow passes the run's params by name
        from trainyard.registry.versions import alias_holder, resolve_version, verify_version
        from trainyard.tracking.mlflow_tracking import client

        c = client()
        version = resolve_version(c, params["model"], params["version"])
        info = verify_version(c, params["model"], version, _trusted_keys())
        return {**info, "alias": params["alias"], "current": alias_holder(c, params["model"], params["alias"])}

    @task.branch
    @fail_permanently
    def needs_approval(params: dict | None = None) -> str:
        """`approve` if the run asks for a human decision, else straight to `move_alias`."""
        assert params is not None  # Airflow passes the run's params by name
        return "approve" if params["require_approval"] else "move_alias"

    approve = ApprovalOperator(
        task_id="approve",
        subject=(
            "Move {{ params.alias }} of {{ params.model }} to version {{ ti.xcom_pull(task_ids='verify')['version'] }}?"
        ),
        body=(
            "Currently `{{ params.alias }}` = version {{ ti.xcom_pull(task_ids='verify')['current'] }}.\n\n"
            "Version {{ ti.xcom_pull(task_ids='verify')['version'] }} verified: "
            "{{ ti.xcom_pull(task_ids='verify')['files'] }} files, manifest "
            "`{{ ti.xcom_pull(task_ids='verify')['manifest_sha256'] }}`, key "
            "`{{ ti.xcom_pull(task_ids='verify')['key_id'] }}`.\n\nReason: {{ params.reason }}\n\n"
            "Requested by {{ dag_run.triggering_user_name or 'airflow' }}."
        ),
        defaults="Reject",  # no answer within response_timeout = Reject = failed run, alias unchanged
        response_timeout=APPROVAL_TIMEOUT,
        fail_on_reject=True,
        retries=0,  # a retry would ask again; a new run is the way to ask again
    )

    @task(trigger_rule="none_failed_min_one_success", on_success_callback=[TeamNotifier(event="promoted")])
    @fail_permanently
    def move_alias(verified: dict, params: dict | None = None) -> dict:
        """Verify again, move the alias, append who/when/from/to/why to the alias history."""
        assert params is not None  # Airflow passes the run's params by name
        from trainyard.registry.versions import promote
        from trainyard.tracking.mlflow_tracking import client

        ctx = get_current_context()
        dag_run = ctx["dag_run"]
        extra: dict[str, str | None] = {"dag_run": f"{dag_run.dag_id}/{dag_run.run_id}"}
        answer = ctx["ti"].xcom_pull(task_ids="approve") if params["require_approval"] else None
        if answer:
            extra["approved_by"] = (answer.get("responded_by_user") or {}).get("name")
        return promote(
            client(),
            params["model"],
            verified["version"],
            params["alias"],
            user=getattr(dag_run, "triggering_user_name", None) or "airflow",
            reason=params["reason"],
            trusted=_trusted_keys(),
            extra=extra,
        )

    # A task call returns an XComArg at parse time; the task it is passed to receives the JSON it stands for
    # at run time. `Any` says both to mypy, which still checks each call's arguments by count and name.
    verified: Any = verify()
    branch = needs_approval()
    moved = move_alias(verified)
    verified >> branch >> [approve, moved]
    approve >> moved


promote_model_dag = promote_model()  # not `dag`: that is the decorator's name

if __name__ == "__main__":
    promote_model_dag.test()
