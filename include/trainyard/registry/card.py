"""A registered version's model card: its governance record in one place, as JSON and Markdown.

Gathered from where each fact lives (the version's tags, its MLflow run's tags, metrics and artifacts, the
audit trail's alias moves and registrations): lineage (dataset commit and digest, code version, dependency
digest, the spec), the data validation, the gate table and champion comparison, the signature and its key,
who measured the metrics, approvals, alias history, cost and queue wait. Stored with the version's run
(``model_card/card.json`` and ``card.md``, outside the signed model files) when the version is registered,
and again whenever one of its aliases moves (promotion, rollback).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CARD_DIR = "model_card"
CARD_TAG = "trainyard.model_card"  # on the version: where its card is


def _artifact_json(c, run_id: str, path: str) -> Any:
    """A JSON artifact of the run, parsed; None when it is missing or no JSON."""
    from trainyard.tracking.mlflow_tracking import read_artifact

    text = read_artifact(c, run_id, path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def _validation_summary(report: Any) -> dict | None:
    """The data validation report (``validation.json``) reduced to its verdict and counts per suite."""
    if not isinstance(report, dict):
        return None
    keep = ("success", "suite", "suites", "statistics", "evaluated", "successful", "unsuccessful", "commit")
    return {k: v for k, v in report.items() if k in keep} or {"recorded": True}


def build(c, name: str, version: str, moves: list[dict]) -> dict:
    """The card of ``name`` version ``version`` as a JSON-able dict; ``moves``: the model's recorded alias
    moves (``registry.versions.History.entries(name)``)."""
    from trainyard.audit import AuditLog
    from trainyard.environment import DEPENDENCIES_TAG
    from trainyard.registry.ownership import owner_or_none
    from trainyard.registry.signing import DIGEST_TAG, KEY_ID_TAG, SIGNATURE_TAG
    from trainyard.spec import SPEC_DIGEST_TAG

    version = str(version)
    mv = c.get_model_version(name, version)
    tags = dict(mv.tags or {})
    run = c.get_run(mv.run_id)
    run_tags, metrics = dict(run.data.tags), dict(run.data.metrics)
    gate = _artifact_json(c, mv.run_id, "gate/gate_result.json")
    if gate is None and tags.get("gate.result"):
        gate = json.loads(tags["gate.result"])
    moves = [e for e in moves if version in (str(e.get("to_version")), str(e.get("from_version")))]
    registered = [
        e for e in AuditLog().entries("registration") if e.get("model") == name and str(e.get("version")) == version
    ]
    checks = (gate or {}).get("checks", [])
    return {
        "model": name,
        "version": version,
        "aliases": sorted(mv.aliases or []),
        "owner": owner_or_none(c, name),
        "created": mv.creation_timestamp,
        "registered_by": registered[0]["actor"] if registered else None,
        "run": {"mlflow_run_id": mv.run_id, "run_key": tags.get("trainyard.run_key"), "run_dir": tags.get("run_dir")},
        "lineage": {
            "dataset": {k: tags.get(f"dataset.{k}") for k in ("store", "repo", "commit", "digest")},
            "code_version": tags.get("code_version"),
            "dependencies_sha256": tags.get(DEPENDENCIES_TAG) or run_tags.get(DEPENDENCIES_TAG),
            "spec_sha256": tags.get(SPEC_DIGEST_TAG),
            "spec": _artifact_json(c, mv.run_id, "spec/job_spec.json"),
            "recipe": tags.get("recipe"),
            "params": json.loads(tags["params"]) if tags.get("params") else None,
            "sweep": {k.removeprefix("sweep."): v for k, v in tags.items() if k.startswith("sweep.")} or None,
        },
        "validation": _validation_summary(_artifact_json(c, mv.run_id, "data_validation/validation.json")),
        "metrics": {k.removeprefix("metric."): float(v) for k, v in tags.items() if k.startswith("metric.")},
        # a built-in recipe's metrics are computed by trainyard's evaluation on the held-out split; a custom
        # command's are what the program reported about itself
        "metrics_measured_by": "custom program (reported)" if tags.get("recipe") == "custom" else "platform",
        "evaluation": {k.removeprefix("eval."): v for k, v in tags.items() if k.startswith("eval.")},
        "gate": {
            "passed": (gate or {}).get("passed"),
            "checks": [c for c in checks if c.get("kind", "threshold") == "threshold"],
        },
        "champion": {
            "version": (gate or {}).get("champion_version"),
            "checks": [c for c in checks if c.get("kind") == "champion"],
        },
        "signature": {
            "manifest_sha256": tags.get(DIGEST_TAG),
            "key_id": tags.get(KEY_ID_TAG),
            "signed": bool(tags.get(SIGNATURE_TAG)),
        },
        "approvals": [
            {"alias": e.get("alias"), "approved_by": e["approved_by"], "at": e.get("at")}
            for e in moves
            if e.get("approved_by") and str(e.get("to_version")) == version
        ],
        "alias_history": [
            {k: e.get(k) for k in ("at", "alias", "action", "from_version", "to_version", "user", "reason")}
            for e in moves
        ],
        "cost": {
            "run_cost": metrics.get("run_cost"),
            "gpu_seconds": metrics.get("gpu_seconds"),
            "queue_wait_seconds": metrics.get("queue_wait_seconds"),
        },
    }


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    def cell(v: Any) -> str:
        text = "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")

    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell(v) for v in r) + " |" for r in rows),
    ]


def _verdict(passed: bool | None) -> str:
    return "not recorded" if passed is None else "passed" if passed else "failed"


def _section(title: str, *body: str) -> list[str]:
    return [f"## {title}", "", *body, ""]


def _lineage(card: dict) -> list[str]:
    lin, ds = card["lineage"], card["lineage"]["dataset"]
    rows = [
        ("dataset", f"{ds['store']}:{ds['repo']} @ {ds['commit']}"),
        ("dataset digest", ds["digest"]),
        ("code version", lin["code_version"]),
        ("dependencies (sha256)", lin["dependencies_sha256"]),
        ("spec (sha256)", lin["spec_sha256"]),
        ("recipe", lin["recipe"]),
        ("hyperparameters", json.dumps(lin["params"], sort_keys=True) if lin["params"] else None),
        ("sweep", json.dumps(lin["sweep"], sort_keys=True) if lin["sweep"] else None),
    ]
    return _section("Lineage", *_table(("what", "value"), rows))


def _gate(card: dict) -> list[str]:
    rows = [
        (c["metric"], c.get("value"), c.get("min"), c.get("max"), c.get("margin"), c["passed"])
        for c in card["gate"]["checks"]
    ]
    return _section(
        f"Gate: {_verdict(card['gate']['passed'])}",
        *_table(("metric", "value", "min", "max", "margin", "passed"), rows),
    )


def _champion(card: dict) -> list[str]:
    champion = card["champion"]
    if not champion["checks"]:
        return _section("Champion comparison", "No champion rules (or no production version to compare with).")
    rows = [(c["metric"], c.get("value"), c.get("champion"), c.get("margin"), c["passed"]) for c in champion["checks"]]
    return _section(
        "Champion comparison",
        f"Against production version {champion['version']}:",
        "",
        *_table(("metric", "challenger", "champion", "margin", "passed"), rows),
    )


def markdown(card: dict) -> str:
    """The card as one Markdown page."""
    sig = card["signature"]
    signed = f"Manifest sha256 `{sig['manifest_sha256']}`, signed by key `{sig['key_id']}`." if sig["signed"] else None
    approvals = [f"- {a['alias']}: approved by {a['approved_by']} at {a['at']}" for a in card["approvals"]]
    moves = [tuple(e.values()) for e in card["alias_history"]]
    lines = [
        f"# Model card: {card['model']} version {card['version']}",
        "",
        f"Owned by team {card.get('owner') or '(not recorded)'}. "
        f"Aliases now: {', '.join(card['aliases']) or 'none'}. Registered by {card['registered_by'] or '-'} "
        f"from run `{card['run']['run_key'] or card['run']['mlflow_run_id']}`.",
        "",
        *_lineage(card),
        *_section(
            "Data validation",
            f"`{json.dumps(card['validation'], sort_keys=True)}`" if card["validation"] else "Not recorded.",
        ),
        *_section(
            f"Metrics (measured by: {card['metrics_measured_by']})",
            *_table(("metric", "value"), sorted(card["metrics"].items())),
        ),
        *_gate(card),
        *_champion(card),
        *_section("Signature", signed or "Not signed."),
        *_section("Approvals", *(approvals or ["None."])),
        *_section("Alias history", *_table(("at", "alias", "action", "from", "to", "by", "reason"), moves)),
        *_section("Cost", *_table(("what", "value"), list(card["cost"].items()))),
    ]
    return "\n".join(lines)


def write(card: dict, folder: Path) -> tuple[Path, Path]:
    """``card.json`` and ``card.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    as_json, as_md = folder / "card.json", folder / "card.md"
    as_json.write_text(json.dumps(card, indent=1, sort_keys=True, default=str))
    as_md.write_text(markdown(card))
    return as_json, as_md


def attach(c, name: str, version: str, moves: list[dict]) -> dict:
    """Build the card and store it with the version's run (replacing the one before); returns it."""
    card = build(c, name, version, moves)
    with tempfile.TemporaryDirectory() as tmp:
        write(card, Path(tmp))
        c.log_artifacts(card["run"]["mlflow_run_id"], tmp, CARD_DIR)
    c.set_model_version_tag(name, str(version), CARD_TAG, f"runs:/{card['run']['mlflow_run_id']}/{CARD_DIR}/card.md")
    return card


def refresh(c, name: str, versions: list[str | None], moves: list[dict]) -> None:
    """Store the cards of ``versions`` again (an alias of theirs moved); a card that cannot be written is
    logged, the move it follows stands."""
    for version in {str(v) for v in versions if v is not None}:
        try:
            attach(c, name, version, moves)
        except Exception:  # noqa: BLE001 - the card is a view of the record; the record is complete
            log.warning("could not update the model card of %s version %s", name, version, exc_info=True)
