"""The model card against a real MLflow registry and audit trail: every field from where it lives, stored
with the version's run when an alias moves, and written as Markdown and JSON by the command."""

import json

import pytest

from trainyard.registry import card, signing, versions

NAME = "digits"
GATE = {
    "passed": True,
    "champion_version": 1,
    "checks": [
        {"kind": "threshold", "metric": "val_accuracy", "value": 0.93, "min": 0.9, "max": None, "passed": True,
         "margin": 0.03},
        {"kind": "champion", "metric": "val_accuracy", "value": 0.93, "min": 0.91, "max": None, "passed": True,
         "margin": 0.02, "champion": 0.91},
    ],
}  # fmt: skip


def _version(c, tmp_path, recipe: str, n: int) -> str:
    """A version as `register` leaves it: a run with its spec, dependency list, validation and gate, the
    model files, the lineage tags; signed, and registered in the audit trail."""
    from trainyard.audit import AuditLog
    from trainyard.tracking import mlflow_tracking as mt

    run = c.create_run(mt.experiment_id(c, NAME, "vision"), tags={"dependencies.sha256": "d" * 64}).info.run_id
    folder = tmp_path / f"run{n}"
    for rel, text in {
        "spec/job_spec.json": json.dumps({"name": NAME, "recipe": recipe}),
        "gate/gate_result.json": json.dumps(GATE),
        "data_validation/validation.json": json.dumps({"success": True, "suite": "digits", "evaluated": 12}),
        "model/MLmodel": f"flavors: {{onnx: {{}}}}\nn: {n}\n",
        "model/model.onnx": f"onnx {n}",
    }.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    c.log_artifacts(run, str(folder))
    for key, value in {"run_cost": 0.25, "gpu_seconds": 500.0, "queue_wait_seconds": 42.0}.items():
        c.log_metric(run, key, value)
    tags = {
        "dataset.store": "local", "dataset.repo": "digits", "dataset.commit": "c" * 64, "dataset.digest": "e" * 64,
        "code_version": "abc123", "recipe": recipe, "params": json.dumps({"learning_rate": 0.1}),
        "spec.sha256": "f" * 64, "metric.val_accuracy": "0.93", "eval.split": "val", "dependencies.sha256": "d" * 64,
        "trainyard.run_key": f"train_pipeline/run-{n}",
    }  # fmt: skip
    version = str(c.create_model_version(NAME, source=f"runs:/{run}/model", run_id=run, tags=tags).version)
    versions.sign_version(c, NAME, version, signing.load_private_key())
    AuditLog().append("registration", "tina", model=NAME, version=version, run_key=tags["trainyard.run_key"])
    return version


@pytest.fixture
def registry(trainyard_home, tmp_path, monkeypatch):
    from trainyard import paths
    from trainyard.registry.ownership import OWNER_TAG
    from trainyard.tracking import mlflow_tracking as mt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    signing.ensure_keypair()
    c = mt.client()
    c.create_registered_model(NAME, tags={OWNER_TAG: "vision"})
    return c, _version(c, tmp_path, "digits_cnn", 1), _version(c, tmp_path, "custom", 2)


def _promote(c, version, alias, user, **extra):
    return versions.promote(c, NAME, version, alias, user=user, reason=f"to {alias}", trusted=signing.trusted_keys(),
                            extra=extra or None)  # fmt: skip


def test_the_card_holds_every_field_from_where_it_lives(registry):
    c, v1, _ = registry
    _promote(c, v1, "staging", "tina")
    _promote(c, v1, "production", "ann", approved_by="bob")
    built = card.build(c, NAME, v1, versions.History().entries(NAME))
    lineage = built["lineage"]
    assert lineage["dataset"] == {"store": "local", "repo": "digits", "commit": "c" * 64, "digest": "e" * 64}
    assert (lineage["code_version"], lineage["dependencies_sha256"], lineage["spec_sha256"]) == (
        "abc123", "d" * 64, "f" * 64,
    )  # fmt: skip
    assert lineage["spec"] == {"name": NAME, "recipe": "digits_cnn"} and lineage["params"] == {"learning_rate": 0.1}
    assert built["validation"] == {"success": True, "suite": "digits", "evaluated": 12}
    assert built["metrics"] == {"val_accuracy": 0.93} and built["metrics_measured_by"] == "platform"
    assert built["gate"] == {"passed": True, "checks": [GATE["checks"][0]]}
    assert built["champion"] == {"version": 1, "checks": [GATE["checks"][1]]}
    tags = c.get_model_version(NAME, v1).tags
    assert built["signature"] == {
        "manifest_sha256": tags[versions.DIGEST_TAG], "key_id": tags[versions.KEY_ID_TAG], "signed": True,
    }  # fmt: skip
    assert [a["approved_by"] for a in built["approvals"]] == ["bob"]
    assert [(m["alias"], m["to_version"], m["user"]) for m in built["alias_history"]] == [
        ("staging", v1, "tina"), ("production", v1, "ann"),
    ]  # fmt: skip
    assert built["cost"] == {"run_cost": 0.25, "gpu_seconds": 500.0, "queue_wait_seconds": 42.0}
    assert built["registered_by"] == "tina" and built["aliases"] == ["production", "staging"]


def test_an_alias_move_stores_the_card_of_both_versions_with_their_runs(registry, tmp_path):
    c, v1, v2 = registry
    _promote(c, v1, "production", "ann")
    _promote(c, v2, "production", "ann")  # v1 loses the alias: its card says so too
    for version, holds in ((v1, []), (v2, ["production"])):
        mv = c.get_model_version(NAME, version)
        assert mv.tags[card.CARD_TAG] == f"runs:/{mv.run_id}/model_card/card.md"
        local = c.download_artifacts(mv.run_id, "model_card", str(tmp_path / "dl" / version))
        stored = json.loads((tmp_path / "dl" / version / "model_card" / "card.json").read_text())
        assert local and stored["aliases"] == holds and len(stored["alias_history"]) == (2 if version == v1 else 1)
    assert card.build(c, NAME, v2, [])["metrics_measured_by"] == "custom program (reported)"
    # the card is no file of the signed version: both still verify
    for version in (v1, v2):
        versions.verify_version(c, NAME, version, signing.trusted_keys())


def test_the_command_writes_markdown_and_json(registry, tmp_path, capsys, login_as):
    from trainyard.cli import main

    c, v1, _ = registry
    login_as("bob")  # of team nlp: not the model's team
    assert main(["models", "card", NAME, v1, "--out", str(tmp_path / "cards")]) == 1
    assert f"model {NAME!r} belongs to team 'vision'; user 'bob'" in capsys.readouterr().err
    login_as("alice")  # of team vision
    assert main(["models", "card", NAME, v1, "--out", str(tmp_path / "cards")]) == 0
    folder = tmp_path / "cards" / f"{NAME}-v{v1}"
    assert json.loads((folder / "card.json").read_text())["version"] == v1
    page = (folder / "card.md").read_text()
    for heading in ("## Lineage", "## Data validation", "## Gate: passed", "## Champion comparison", "## Signature",
                    "## Approvals", "## Alias history", "## Cost"):  # fmt: skip
        assert heading in page
    assert "c" * 64 in page and "Against production version 1" in page
    assert main(["models", "card", NAME, "99", "--out", str(tmp_path)]) == 1
    assert "digits version 99" in capsys.readouterr().err
