"""promote_model through Airflow (`dag.test()`): a signed version moves to production; a tampered one does not."""

import re
from pathlib import Path

import pytest
from dag_helpers import load_dag, staged_version, task_states

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
NAME = "digits"


@pytest.fixture(scope="module")
def dag():
    return load_dag("promote_model")


@pytest.fixture
def answered(dag, monkeypatch):
    """For a test whose _Responder answers the approval: dag.test() waits for it with no limit of its own, so
    an answer that never comes (a responder that failed) ends the wait as the product's would, only sooner,
    and the test fails on the responder's error."""
    from datetime import timedelta

    monkeypatch.setattr(dag.get_task("approve"), "response_timeout", timedelta(minutes=3))


@pytest.fixture
def policy(tmp_path, monkeypatch):
    """Write resources.yaml's team policies for the test: ``policy(team=..., **fields)``."""
    import shutil

    import yaml

    config = tmp_path / "config"
    shutil.copytree(REPO / "include" / "config", config)
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))

    def write(team: str = "default", **fields):
        fleet = yaml.safe_load((config / "resources.yaml").read_text())
        fleet["teams"][team].setdefault("policy", {}).update(fields)
        (config / "resources.yaml").write_text(yaml.safe_dump(fleet))

    return write


@pytest.fixture
def staged(trainyard_home, tmp_path, monkeypatch, policy):
    """A signed version of NAME, owned by team default, under the staging alias (as train_pipeline leaves
    one), default key pair."""
    from trainyard import paths
    from trainyard.registry import signing

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    signing.ensure_keypair()  # the trainyard_home fixture may already come with one
    c, version = staged_version(NAME, "default", tmp_path)
    stored = next((trainyard_home / "mlflow" / "artifacts").rglob("model.onnx"))
    return {"client": c, "version": version, "onnx": stored}


def test_promote_without_approval(dag, staged, policy):
    from trainyard.registry.versions import History, alias_holder

    policy(approval=[])  # the owning team's policy, not the requester's choice

    dr = dag.test(run_conf={"model": NAME, "version": "", "alias": "production", "reason": "first release"})
    states = task_states(dr)
    assert dr.state == "success", states
    assert states == {"verify": "success", "needs_approval": "success", "approve": "skipped", "move_alias": "success"}
    assert alias_holder(staged["client"], NAME, "production") == staged["version"]
    [entry] = History().entries(NAME, "production")
    assert (entry["from_version"], entry["to_version"], entry["reason"]) == (None, staged["version"], "first release")
    assert entry["user"] == "dag_test"  # dag.test()'s triggering user
    assert entry["dag_run"] == f"promote_model/{dr.run_id}" and "approved_by" not in entry


def test_tampered_version_is_not_promoted(dag, staged):
    from trainyard.registry.versions import History, alias_holder

    data = bytearray(staged["onnx"].read_bytes())
    data[7] ^= 0x40
    staged["onnx"].write_bytes(bytes(data))
    dr = dag.test(run_conf={"model": NAME, "version": staged["version"], "alias": "production", "reason": "x"})
    states = task_states(dr)
    assert dr.state == "failed"
    assert states["verify"] == "failed" and states["move_alias"] in ("upstream_failed", "skipped"), states
    assert alias_holder(staged["client"], NAME, "production") is None
    assert History().entries(NAME, "production") == []


def test_approval_gate_is_configured(dag):
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    approve = dag.get_task("approve")
    assert isinstance(approve, ApprovalOperator)
    assert approve.fail_on_reject and approve.response_timeout and approve.defaults == ["Reject"]
    assert approve.retries == 0
    assert dag.get_task("move_alias").upstream_task_ids == {"verify", "needs_approval", "approve"}
    assert dag.get_task("move_alias").trigger_rule == "none_failed_min_one_success"


def test_verify_key_comes_from_the_connection(dag, staged, tmp_path, monkeypatch):
    """A `trainyard_signing` connection overrides the key file: here it holds another key, so nothing moves."""
    import json

    from trainyard.registry import signing
    from trainyard.registry.versions import alias_holder

    _, other = signing.generate_keypair(tmp_path / "other")
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRAINYARD_SIGNING",
        json.dumps({"conn_type": "generic", "extra": {"verify_key": other.read_text()}}),
    )
    dr = dag.test(run_conf={"model": NAME, "version": staged["version"], "alias": "production", "reason": "x"})
    assert task_states(dr)["verify"] == "failed"
    assert alias_holder(staged["client"], NAME, "production") is None


class _Responder:
    """Answers the `approve` task of the newest promote_model run once it waits, as the REST PATCH
    .../hitlDetails does (its route function, called with a user), while dag.test() runs in this thread."""

    def __init__(self, option: str, user: str = "cid"):
        import threading

        self.option, self.user, self.error = option, user, None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join(timeout=60)

    def _run(self):
        import time

        from airflow.api_fastapi.core_api.datamodels.hitl import UpdateHITLDetailPayload
        from airflow.api_fastapi.core_api.routes.public.hitl import update_hitl_detail
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState

        user = type("User", (), {"get_id": lambda s: self.user, "get_name": lambda s: self.user})()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with create_session() as session:
                    ti = (
                        session.query(TaskInstance)
                        .filter_by(dag_id="promote_model", task_id="approve", state=TaskInstanceState.AWAITING_INPUT)
                        .order_by(TaskInstance.start_date.desc())
                        .first()
                    )
                    if ti is not None:
                        update_hitl_detail(
                            dag_id=ti.dag_id,
                            dag_run_id=ti.run_id,
                            task_id="approve",
                            update_hitl_detail_payload=UpdateHITLDetailPayload(
                                chosen_options=[self.option], params_input={}
                            ),
                            user=user,
                            session=session,
                        )
                        self.error = None
                        return
            except Exception as err:  # e.g. the database busy with dag.test()'s own writes: ask again
                self.error = repr(err)  # surfaced by the test if no later try answers
            time.sleep(0.5)
        self.error = self.error or "approve never waited for input"


@pytest.mark.parametrize("option", ["Approve", "Reject"])
def test_with_approval(dag, staged, answered, option):
    from trainyard.registry.versions import History, alias_holder

    conf = {"model": NAME, "version": "", "alias": "production", "reason": "launch"}  # approval: by default
    with _Responder(option) as responder:
        dr = dag.test(run_conf=conf)
    assert responder.error is None, responder.error
    states = task_states(dr)
    if option == "Approve":
        assert dr.state == "success", states
        assert states["approve"] == "success" and states["move_alias"] == "success"
        assert alias_holder(staged["client"], NAME, "production") == staged["version"]
        [entry] = History().entries(NAME, "production")
        assert entry["approved_by"] == "cid" and entry["user"] == "dag_test" and entry["team"] == "default"
        _the_move_reads_its_approval_from_the_audit_trail(entry["dag_run"], staged["version"])
    else:
        assert dr.state == "failed", states
        assert states["approve"] == "failed" and states["move_alias"] == "upstream_failed"
        assert alias_holder(staged["client"], NAME, "production") is None
        assert History().entries(NAME, "production") == []


def _the_move_reads_its_approval_from_the_audit_trail(run: str, version: str) -> None:
    """The approve task recorded who approved which version in the audit trail, which no user writes (an
    XCom they may, over REST): the move's check reads it there, and holds it to the version."""
    from trainyard.audit import AuditLog
    from trainyard.teams import NotAllowed
    from trainyard_airflow.operators.approval import APPROVAL, APPROVAL_ASKED, approved_by

    [asked] = [e for e in AuditLog().entries(APPROVAL_ASKED) if e["dag_run"] == run]  # before the approver saw it
    [approval] = [e for e in AuditLog().entries(APPROVAL) if e["dag_run"] == run]
    assert (asked["version"], asked["actor"]) == (version, "dag_test")
    assert (approval["actor"], approval["version"], approval["requester"]) == ("cid", version, "dag_test")
    assert approved_by(NAME, "dag_test", run, version) == "cid"
    other = re.escape(f"version {version} of '{NAME}' was approved in {run}, not version 99")
    with pytest.raises(NotAllowed, match=other):
        approved_by(NAME, "dag_test", run, "99")  # another version than the approved one
    with pytest.raises(NotAllowed, match="needs an approval, and none was recorded"):
        approved_by(NAME, "dag_test", "promote_model/another-run", version)  # a run nobody approved


def test_the_requester_cannot_approve_their_own_move(dag, staged, answered):
    from trainyard.registry.versions import History, alias_holder

    conf = {"model": NAME, "version": "", "alias": "production", "reason": "launch"}
    with _Responder("Approve", user="dag_test") as responder:  # dag.test() triggers as dag_test
        dr = dag.test(run_conf=conf)
    assert responder.error is None, responder.error
    states = task_states(dr)
    assert states["approve"] == "failed" and states["move_alias"] == "upstream_failed", states
    assert alias_holder(staged["client"], NAME, "production") is None and History().entries(NAME, "production") == []


def test_a_user_outside_the_owning_team_cannot_move_its_aliases(dag, staged, policy):
    """Team vision (members admin, alice) owns the model: dag_test may neither promote nor roll back."""
    from trainyard.audit import AuditLog
    from trainyard.registry import ownership
    from trainyard.registry.versions import alias_holder

    ownership.set_owner(staged["client"], NAME, "vision", replace=True)
    for action in ("promote", "rollback"):
        conf = {"model": NAME, "version": staged["version"], "alias": "staging", "reason": "x", "action": action}
        states = task_states(dag.test(run_conf=conf))
        assert states["verify"] == "failed" and states["move_alias"] in ("upstream_failed", "skipped"), states
    policy(team="default", promoters=["nobody"])  # a member who is not a promoter is refused the same way
    ownership.set_owner(staged["client"], NAME, "default", replace=True)
    states = task_states(dag.test(run_conf={"model": NAME, "version": "", "alias": "production", "reason": "x"}))
    assert states["verify"] == "failed", states
    assert alias_holder(staged["client"], NAME, "production") is None
    refusals = AuditLog().entries("ownership_refusal")  # each refusal, whichever task made it, is audited
    assert [e["actor"] for e in refusals] == ["dag_test"] * 3
    assert "may not move aliases of model" in refusals[-1]["refused"] and refusals[-1]["dag_run"].startswith(
        "promote_model/"
    )
