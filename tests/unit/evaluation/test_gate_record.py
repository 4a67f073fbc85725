"""The gate result as stored on the MLflow run (and copied to the model version)."""

import json

from trainyard.evaluation.champion import combined_gate
from trainyard.evaluation.gate_record import gate_tags, record_gate
from trainyard.spec import ChampionRule, Threshold

THRESHOLDS = [Threshold(metric="val_map", min=0.5), Threshold(metric="val_map_50", min=0.9)]
RULES = [ChampionRule(metric="val_map", margin=0.01, higher_is_better=True)]


def test_every_check_becomes_a_tag():
    result = combined_gate({"val_map": 0.62, "val_map_50": 0.85}, THRESHOLDS, {"val_map": 0.6}, RULES)
    tags = gate_tags(result)
    assert tags["gate.passed"] == "false"
    assert tags["gate.threshold.val_map"] == "pass: value=0.62, min=0.5, margin=0.12"
    assert tags["gate.threshold.val_map_50"].startswith("FAIL: value=0.85, min=0.9, margin=-0.05")
    assert tags["gate.champion.val_map"] == "pass: value=0.62, min=0.61, margin=0.01, champion=0.6"
    assert json.loads(tags["gate.result"]) == json.loads(json.dumps(result))
    assert all(len(v) <= 5000 for v in tags.values())


def test_missing_metric_and_first_model():
    result = combined_gate({"val_map": 0.7}, THRESHOLDS, None, RULES)
    tags = gate_tags(result)
    assert tags["gate.threshold.val_map_50"] == "FAIL: value=missing, min=0.9"
    assert tags["gate.champion.val_map"] == "pass: value=0.7"  # no champion yet


def test_recorded_on_the_run(trainyard_home, tmp_path):
    from trainyard.tracking.mlflow_tracking import client, ensure_run

    c = client()
    run_id = ensure_run(c, experiment="gatecheck", run_key="k", run_name="k", team="default", tags={})
    result = combined_gate({"val_map": 0.4, "val_map_50": 0.95}, THRESHOLDS, None, [])
    record_gate(run_id, str(tmp_path), result)
    run = c.get_run(run_id)
    assert run.data.tags["gate.passed"] == "false" and run.data.tags["gate.threshold.val_map"].startswith("FAIL")
    assert [a.path for a in c.list_artifacts(run_id, "gate")] == ["gate/gate_result.json"]
    # the experiment opens in MLflow's model-training view, not its GenAI one
    assert c.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_an_oversized_result_stays_valid_json():
    many = [Threshold(metric=f"val_m{i:03d}", min=0.5) for i in range(200)]
    result = combined_gate({f"val_m{i:03d}": 0.1 for i in range(200)}, many, None, [])
    tag = gate_tags(result)["gate.result"]
    assert len(tag) <= 5000
    short = json.loads(tag)
    assert short["passed"] is False and short["complete"] is False and short["artifact"] == "gate/gate_result.json"
    assert short["failed"][:2] == ["val_m000", "val_m001"]
