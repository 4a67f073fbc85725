"""Signing, promotion, history and rollback against a real MLflow (SQLite store, file artifacts)."""

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from trainyard.registry import signing, versions
from trainyard.registry.signing import VerificationError
from trainyard.registry.versions import History, RollbackError

NAME = "digits"


def _files(folder: Path, seed: int, count: int = 3) -> Path:
    folder.mkdir(parents=True)
    (folder / "MLmodel").write_text(f"flavors: {{onnx: {{}}}}\nseed: {seed}\n")
    (folder / "model.onnx").write_bytes(bytes((seed * 31 + i) % 256 for i in range(4096)))
    for i in range(count - 2):
        (folder / "extra" / f"f{i}.txt").parent.mkdir(exist_ok=True)
        (folder / "extra" / f"f{i}.txt").write_text(f"{seed}-{i}")
    return folder


def _stored_file(home: Path, version_source: str, name: str) -> Path:
    hits = [p for p in (home / "mlflow" / "artifacts").rglob(name) if version_source in str(p)]
    assert len(hits) == 1, hits
    return hits[0]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def reg(trainyard_home, tmp_path, monkeypatch):
    """Two versions of NAME: v1 from a run's artifact folder (runs:/ source), v2 as an MLflow 3 logged model
    (models:/ source, as mlflow.onnx.log_model makes them); both signed with the default key pair."""
    from trainyard import paths
    from trainyard.tracking import mlflow_tracking as mt

    # create_model_version looks a models:/ source up through the global tracking URI, not the client's.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())

    signing.ensure_keypair()  # the trainyard_home fixture may already come with one
    c = mt.client()
    exp = mt.experiment_id(c, NAME, "default")
    run = c.create_run(exp).info.run_id
    c.log_artifacts(run, str(_files(tmp_path / "v1", 1)), "model")
    c.create_registered_model(NAME)
    v1 = c.create_model_version(NAME, source=f"runs:/{run}/model", run_id=run).version
    lm = c.create_logged_model(exp, name="model", source_run_id=run)
    c.log_model_artifacts(lm.model_id, str(_files(tmp_path / "v2", 2)))
    v2 = c.create_model_version(NAME, source=f"models:/{lm.model_id}", run_id=run).version
    key = signing.load_private_key()
    for v in (v1, v2):
        assert versions.sign_version(c, NAME, v, key)["changed"] is True
    return {
        "client": c,
        "v1": str(v1),
        "v2": str(v2),
        "run": run,
        "model_id": lm.model_id,
        "home": trainyard_home,
        "trusted": signing.trusted_keys(),
        "history": History(),
    }


def _promote(reg, version, alias="production", reason="because"):
    return versions.promote(
        reg["client"], NAME, version, alias, user="ann", reason=reason, trusted=reg["trusted"], history=reg["history"]
    )


def test_sign_stores_tags_and_is_idempotent(reg):
    c = reg["client"]
    tags = c.get_model_version(NAME, reg["v1"]).tags
    manifest = json.loads(tags[versions.MANIFEST_TAG])
    assert set(manifest["files"]) == {"MLmodel", "model.onnx", "extra/f0.txt"}
    assert manifest["model"] == NAME and manifest["version"] == reg["v1"] and manifest["run_id"] == reg["run"]
    assert tags[versions.DIGEST_TAG] == signing.digest(manifest)
    again = versions.sign_version(c, NAME, reg["v1"], signing.load_private_key())
    assert again["changed"] is False and again["manifest_sha256"] == tags[versions.DIGEST_TAG]
    assert c.get_model_version(NAME, reg["v1"]).tags == tags
    info = versions.verify_version(c, NAME, reg["v2"], reg["trusted"])
    assert info["files"] == 3 and info["key_id"] == signing.key_id(signing.load_private_key())


def test_resigning_changed_content_is_refused(reg):
    _flip(_stored_file(reg["home"], reg["model_id"], "model.onnx"))
    with pytest.raises(VerificationError, match="already signed over different content"):
        versions.sign_version(reg["client"], NAME, reg["v2"], signing.load_private_key())


def test_unsigned_version_is_refused(reg, tmp_path):
    c = reg["client"]
    c.log_artifacts(reg["run"], str(_files(tmp_path / "v3", 3)), "model3")
    v3 = c.create_model_version(NAME, source=f"runs:/{reg['run']}/model3", run_id=reg["run"]).version
    with pytest.raises(VerificationError, match="not signed"):
        _promote(reg, v3)
    assert versions.alias_holder(c, NAME, "production") is None


def test_signature_of_another_version_is_refused(reg):
    c = reg["client"]
    for key, value in c.get_model_version(NAME, reg["v1"]).tags.items():
        c.set_model_version_tag(NAME, reg["v2"], key, value)
    with pytest.raises(VerificationError) as err:
        versions.verify_version(c, NAME, reg["v2"], reg["trusted"])
    assert any("manifest is for" in p for p in err.value.problems)
    assert any(p.startswith("model.onnx: content changed") for p in err.value.problems)


def test_promote_history_live_at_and_rollback(reg):
    c, v1, v2 = reg["client"], reg["v1"], reg["v2"]
    first = _promote(reg, v1, reason="first release")
    second = _promote(reg, v2, reason="better accuracy")
    assert versions.alias_holder(c, NAME, "production") == v2
    entries = reg["history"].entries(NAME, "production")
    assert [(e["from_version"], e["to_version"], e["reason"], e["user"]) for e in entries] == [
        (None, v1, "first release", "ann"),
        (v1, v2, "better accuracy", "ann"),
    ]
    assert entries[1]["manifest_sha256"] == c.get_model_version(NAME, v2).tags[versions.DIGEST_TAG]

    t1, t2 = datetime.fromisoformat(first["at"]), datetime.fromisoformat(second["at"])
    assert versions.live_at(reg["history"], NAME, "production", t1 + (t2 - t1) / 2) == v1
    assert versions.live_at(reg["history"], NAME, "production", t1 - timedelta(seconds=1)) is None
    assert versions.live_at(reg["history"], NAME, "production", (t2 + timedelta(days=1)).isoformat()) == v2
    assert versions.live_at(entries, NAME, "staging", t2) is None

    back = versions.rollback(c, NAME, user="bob", reason="regression", trusted=reg["trusted"], history=reg["history"])
    assert (back["from_version"], back["to_version"], back["action"], back["user"]) == (v2, v1, "rollback", "bob")
    assert versions.alias_holder(c, NAME, "production") == v1
    with pytest.raises(RollbackError, match="name the version"):
        versions.rollback(c, NAME, user="bob", reason="again", trusted=reg["trusted"], history=reg["history"])
    mirrored = json.loads(c.get_registered_model(NAME).tags[versions.HISTORY_TAG])
    assert [e["to_version"] for e in mirrored] == [v1, v2, v1]


def test_promote_again_is_a_no_op(reg):
    _promote(reg, reg["v1"])
    again = _promote(reg, reg["v1"])
    assert again["changed"] is False
    assert len(reg["history"].entries(NAME)) == 1


def test_tampered_artifact_blocks_promote_and_rollback(reg):
    c, v1, v2 = reg["client"], reg["v1"], reg["v2"]
    _promote(reg, v1)
    _promote(reg, v2)
    _flip(_stored_file(reg["home"], reg["run"] + "/artifacts/model", "model.onnx"))  # v1's file
    with pytest.raises(VerificationError) as err:
        versions.rollback(c, NAME, user="bob", reason="regression", trusted=reg["trusted"], history=reg["history"])
    assert err.value.problems[0].startswith("model.onnx: content changed")
    assert versions.alias_holder(c, NAME, "production") == v2
    assert len(reg["history"].entries(NAME)) == 2

    (_stored_file(reg["home"], reg["model_id"], "MLmodel").parent / "extra" / "payload.py").write_text("evil\n")
    with pytest.raises(VerificationError, match=r"extra/payload.py: extra file"):
        _promote(reg, v2, alias="staging")
    assert versions.alias_holder(c, NAME, "staging") is None
    assert len(reg["history"].entries(NAME)) == 2


def test_large_manifest_is_split_across_tags(reg, tmp_path):
    c = reg["client"]
    c.log_artifacts(reg["run"], str(_files(tmp_path / "big", 9, count=120)), "big")
    v = c.create_model_version(NAME, source=f"runs:/{reg['run']}/big", run_id=reg["run"]).version
    versions.sign_version(c, NAME, v, signing.load_private_key())
    tags = c.get_model_version(NAME, v).tags
    assert int(tags[versions.PARTS_TAG]) >= 2 and versions.MANIFEST_TAG not in tags
    assert all(len(value) <= versions.TAG_LIMIT for value in tags.values())
    assert versions.verify_version(c, NAME, v, reg["trusted"])["files"] == 120


@pytest.mark.parametrize(
    "moves, current, expected",
    [
        ([], "1", None),
        ([("promote", None, "1")], "1", None),
        ([("promote", None, "1"), ("promote", "1", "2")], "2", "1"),
        ([("promote", None, "1"), ("promote", "1", "2"), ("promote", "2", "3"), ("rollback", "3", "2")], "2", "1"),
        ([("promote", None, "1"), ("promote", "1", "2"), ("rollback", "2", "1"), ("promote", "1", "4")], "4", "1"),
        ([("promote", "7", "8")], "8", "7"),  # the first recorded move knows what it replaced
        ([("promote", None, "1"), ("promote", "1", "2")], "5", None),  # moved outside trainyard: no guess
    ],
)
def test_previous_version(moves, current, expected):
    entries = [{"action": a, "from_version": f, "to_version": t} for a, f, t in moves]
    assert versions.previous_version(entries, current) == expected


def test_history_file_survives_a_torn_write(tmp_path):
    h = History(tmp_path / "h.jsonl")
    h.append({"model": "m", "alias": "production", "to_version": "1", "user": "u"})
    with open(h.path, "ab") as f:
        f.write(b'{"model": "m", "alias": "produ')  # a writer died here
    h.append({"model": "m", "alias": "production", "to_version": "2", "user": "u"})
    assert [e["to_version"] for e in h.entries("m")] == ["1", "2"]


def test_cli(reg, capsys, monkeypatch, login_as):
    import argparse

    from trainyard.audit import AuditLog
    from trainyard.registry.cli import add_models_parser

    parser = argparse.ArgumentParser(prog="trainyard")
    add_models_parser(parser.add_subparsers(dest="command", required=True))

    def run(*argv):
        args = parser.parse_args(["models", *argv])
        return args.func(args), capsys.readouterr()

    for name in ("AIRFLOW_API_TOKEN", "AIRFLOW_API_USERNAME", "AIRFLOW_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(reg["home"] / "no-config"))
    assert run("keygen", "--if-missing")[0] == 0
    assert run("keygen")[0] == 1
    rc, out = run("verify", NAME, reg["v1"])  # a model no team owns yet: an admin's to read, and name an owner
    assert rc == 1 and f"model {NAME!r} has no owning team recorded" in out.err
    # an alias moves through promote_model as the Airflow login's user, never as a name typed here
    rc, out = run("promote", NAME, reg["v1"], "--reason", "launch")
    assert rc == 1 and "no Airflow login" in out.err
    assert run("rollback", NAME)[0] == 1 and History().entries(NAME) == []
    _promote(reg, reg["v1"])
    _promote(reg, reg["v2"])
    login_as("admin", "admin")
    rc, out = run("verify", NAME, reg["v1"])
    assert rc == 0 and json.loads(out.out)["version"] == reg["v1"]
    rc, out = run("history", NAME)
    assert out.out.count("ann: because") == 2
    rc, out = run("live-at", NAME, "2000-01-01")
    assert rc == 1 and "no recorded" in out.err
    rc, out = run("live-at", NAME, (datetime.now().astimezone() + timedelta(minutes=1)).isoformat())
    assert rc == 0 and out.out.strip() == reg["v2"]
    rc, out = run("owner", NAME)
    assert rc == 1 and f"model {NAME!r} has no owning team recorded" in out.err
    monkeypatch.delenv("AIRFLOW_API_TOKEN")
    rc, out = run("owner", NAME, "default")  # an admin's act: by the Airflow login, never a typed name
    assert rc == 1 and "no Airflow login" in out.err
    login_as("alice")
    rc, out = run("owner", NAME, "default")
    assert rc == 1 and "only an Airflow admin names a model's owner; user 'alice'" in out.err
    login_as("admin", "admin")
    assert run("owner", NAME, "nowhere")[0] == 1
    rc, out = run("owner", NAME, "default")
    assert rc == 0 and run("owner", NAME)[1].out.strip() == "default"
    assert AuditLog().entries("model_owner")[-1]["actor"] == "admin"
    assert run("owner", NAME, "vision")[0] == 1  # owned: only with --replace
    assert run("owner", NAME, "vision", "--replace")[0] == 0


def test_an_alias_moved_outside_trainyard_is_flagged_and_refused_as_a_source(reg):
    from trainyard.audit import AuditLog
    from trainyard.registry.versions import UnexplainedAlias

    c = reg["client"]
    _promote(reg, reg["v1"])
    assert versions.unexplained_aliases(c, NAME, reg["history"]) == {}
    c.set_registered_model_alias(NAME, "production", reg["v2"])  # the MLflow UI, behind trainyard's back
    (why,) = versions.unexplained_aliases(c, NAME, reg["history"]).values()
    assert "points at version 2, but trainyard's history has it at version 1" in why
    with pytest.raises(UnexplainedAlias, match="not a source to rollback from"):
        versions.rollback(c, NAME, user="ann", reason="r", trusted=reg["trusted"], history=reg["history"])
    with pytest.raises(UnexplainedAlias, match="point it back at version 1 in MLflow, then promote again"):
        _promote(reg, reg["v1"], reason="again")
    c.set_registered_model_alias(NAME, "production", reg["v1"])  # put back: explained again, promotable
    assert _promote(reg, reg["v2"])["from_version"] == reg["v1"]
    moves = AuditLog().entries("alias_move")
    assert [(e["actor"], e["to_version"]) for e in moves] == [("ann", reg["v1"]), ("ann", reg["v2"])]
    assert AuditLog().verify() == ([], [])


def test_moves_recorded_before_the_audit_trail_are_imported_once(trainyard_home):
    legacy = trainyard_home / "registry" / "alias_history.jsonl"
    legacy.parent.mkdir(parents=True)
    old = {"model": "m", "alias": "production", "from_version": None, "to_version": "1", "user": "bob"}
    legacy.write_text(json.dumps({**old, "reason": "launch", "at": "2026-01-02T03:04:05+00:00"}) + "\n")
    History()
    (entry,) = History().entries("m")  # a second History imports nothing again
    assert entry["at"] == "2026-01-02T03:04:05+00:00" and entry["actor"] == "bob" and entry["to_version"] == "1"
    assert versions.live_at(History(), "m", "production", "2026-01-03") == "1"


def test_rotated_keys_keep_verifying_until_distrusted(reg):
    """After a rotation the versions the old key signed still verify (its public half stays trusted); once
    it is distrusted they are refused, naming the key, and so is promoting one."""
    c = reg["client"]
    old, new = signing.rotate()
    assert versions.verify_version(c, NAME, reg["v1"], signing.trusted_keys())["key_id"] == old
    signing.distrust(old)
    with pytest.raises(VerificationError, match=f"signed with key {old}, which is not trusted"):
        versions.verify_version(c, NAME, reg["v1"], signing.trusted_keys())
    with pytest.raises(VerificationError, match="not trusted"):
        versions.promote(c, NAME, reg["v1"], "production", user="ann", reason="r", trusted=signing.trusted_keys())
    assert new in signing.trusted_keys()
    # someone checked v1's files: it is signed again with the current key, and verifies
    assert versions.sign_version(c, NAME, reg["v1"], signing.load_private_key())["changed"] is False
    assert versions.sign_version(c, NAME, reg["v1"], signing.load_private_key(), replace=True)["changed"] is True
    assert versions.verify_version(c, NAME, reg["v1"], signing.trusted_keys())["key_id"] == new


def test_a_version_signed_with_a_key_from_elsewhere_is_refused(reg, tmp_path):
    """A valid signature by a key trainyard does not trust (forged by whoever made that key) is refused."""
    c = reg["client"]
    v3 = c.create_model_version(NAME, source=f"models:/{reg['model_id']}", run_id=reg["run"]).version
    foreign_private, _ = signing.generate_keypair(tmp_path / "elsewhere")
    foreign = signing.load_private_key(foreign_private)
    versions.sign_version(c, NAME, v3, foreign)
    with pytest.raises(VerificationError, match=f"signed with key {signing.key_id(foreign)}, which is not trusted"):
        versions.verify_version(c, NAME, v3, reg["trusted"])


def test_a_move_made_again_by_its_run_or_after_the_alias_moved_changes_nothing(reg):
    """A cleared move_alias of an old promote_model run must not move the alias back to what that run once
    approved; a move approved while another version held the alias is refused once the alias has moved."""
    from trainyard.registry.versions import AliasMoved, alias_holder

    c, run = reg["client"], {"dag_run": "promote_model/old"}
    first = versions.promote(
        c, NAME, reg["v1"], "production", user="ann", reason="r", trusted=reg["trusted"], extra=run
    )
    _promote(reg, reg["v2"])
    again = versions.promote(
        c, NAME, reg["v1"], "production", user="ann", reason="r", trusted=reg["trusted"], extra=run
    )
    assert again["changed"] is False and again["seq"] == first["seq"]
    assert alias_holder(c, NAME, "production") == reg["v2"]
    with pytest.raises(AliasMoved, match="points at version 2 now, not at 1"):
        versions.promote(
            c, NAME, reg["v1"], "production", user="ann", reason="r", trusted=reg["trusted"], expected_holder=reg["v1"]
        )
    assert alias_holder(c, NAME, "production") == reg["v2"]
