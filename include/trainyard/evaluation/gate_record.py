"""A gate's result where people look for it: the MLflow run's tags (``gate.*``, then the model version's)
and ``gate/gate_result.json`` beside them."""

from __future__ import annotations

import json
from pathlib import Path


def gate_tags(result: dict) -> dict[str, str]:
    """The gate result as tags: ``gate.passed``, ``gate.result`` (compact JSON of every check) and one
    ``gate.<kind>.<metric>`` line per check (value, bound, margin, verdict)."""
    tags = {"gate.passed": str(bool(result["passed"])).lower()}
    for row in result["checks"]:
        bound = ", ".join(f"{k}={row[k]:.6g}" for k in ("min", "max") if row.get(k) is not None)
        value = "missing" if row.get("value") is None else f"{row['value']:.6g}"
        margin = "" if row.get("margin") is None else f", margin={row['margin']:.6g}"
        extra = f", champion={row['champion']:.6g}" if row.get("champion") is not None else ""
        tags[f"gate.{row['kind']}.{row['metric']}"] = (
            f"{'pass' if row['passed'] else 'FAIL'}: value={value}{', ' + bound if bound else ''}{margin}{extra}"
        )
    if result.get("champion_version") is not None:
        tags["gate.champion_version"] = str(result["champion_version"])
    compact = json.dumps(result, sort_keys=True, separators=(",", ":"), default=str)
    if len(compact) > 5000:  # still valid JSON: the verdict, what failed, and where the whole result is
        compact = json.dumps(
            {
                "passed": result["passed"],
                "complete": False,
                "artifact": "gate/gate_result.json",
                "failed": [r["metric"] for r in result["checks"] if not r["passed"]][:100],
            },
            separators=(",", ":"),
        )
    tags["gate.result"] = compact
    return tags


def record_gate(run_id: str, out_dir: str, result: dict) -> None:
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    path = Path(out_dir) / "gate_result.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    c.log_artifact(run_id, str(path), "gate")
    for k, v in gate_tags(result).items():
        c.set_tag(run_id, k, v)
