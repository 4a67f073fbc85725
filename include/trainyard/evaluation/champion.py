"""Champion/challenger: a new model must beat the one in production, not just clear fixed thresholds.

A rule ``{"metric": "val_map", "margin": 0.01, "higher_is_better": True}`` asks the challenger for
``val_map >= champion's val_map + 0.01`` (for ``higher_is_better: False``, ``<= champion - margin``).
Both sets of metrics must come from the same evaluation data, or the comparison means nothing; the caller
re-evaluates the champion on the challenger's eval split rather than reusing its old numbers.

Rows are ``gate.Check`` rows (the bound the challenger needed is ``min`` or ``max``, ``margin`` is how far
it cleared that bound, negative when it fell short) extended with the champion's value, the required
margin and a note, so threshold and champion rows render and serialise the same way.

* No champion at all (the first model): every rule passes, with a note saying so.
* The challenger lacks a metric: fail, as in ``evaluate_gate``.
* The champion lacks a metric (a rule added after it was registered): fail, since no comparison was
  made; re-evaluate the champion to get it.

The rule itself is the JobSpec's ``ChampionRule`` (validated where the spec enters; ``higher_is_better``
defaults to true there, which the field's description says): no second rule class with its own checks.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.evaluation.gate import Check, GateResult, evaluate_gate
from trainyard.spec import ChampionRule, JobSpec, Threshold

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData


@dataclass(frozen=True)
class ChampionCheck(Check):
    champion: float | None = None
    required_margin: float = 0.0
    higher_is_better: bool = True
    note: str = ""

    def describe(self) -> str:
        if self.value is None:
            return f"{self.metric}: missing (the challenger has no such metric)"
        if self.champion is None:
            return f"{self.metric} = {self.value:.4f}: {self.note}"
        sign, bound = (">=", self.min) if self.higher_is_better else ("<=", self.max)
        op = "+" if self.higher_is_better else "-"
        return (
            f"{self.metric} = {self.value:.4f} vs champion {self.champion:.4f}, "
            f"needs {sign} {bound:.4f} (champion {op} margin {self.required_margin:g}): {self.verdict()}"
        )


def _check(rule: ChampionRule, value, champion: dict[str, float] | None) -> ChampionCheck:
    check = functools.partial(
        ChampionCheck, metric=rule.metric, required_margin=float(rule.margin), higher_is_better=rule.higher_is_better
    )
    value = None if value is None else float(value)
    if value is None:
        return check(value=None, min=None, max=None, passed=False, margin=None)
    if champion is None:
        note = "no champion yet: first model passes"
        return check(value=value, min=None, max=None, passed=True, margin=None, note=note)
    if champion.get(rule.metric) is None:
        note = "the champion has no such metric: re-evaluate it on this eval data"
        return check(value=value, min=None, max=None, passed=False, margin=None, note=note)
    best = float(champion[rule.metric])
    bound = best + rule.margin if rule.higher_is_better else best - rule.margin
    lo, hi = (bound, None) if rule.higher_is_better else (None, bound)
    slack = value - bound if rule.higher_is_better else bound - value
    # "exactly the margin" passes, as in evaluate_gate; isclose keeps the float error of champion +/- margin
    # (0.9 + 0.01 != 0.91) from failing it
    passed = slack >= 0 or math.isclose(value, bound, rel_tol=1e-12, abs_tol=1e-12)
    return check(value=value, min=lo, max=hi, passed=passed, margin=slack, champion=best)


def champion_check(
    challenger: dict[str, float], champion: dict[str, float] | None, rules: Sequence[ChampionRule]
) -> list[ChampionCheck]:
    """One row per rule, pass or fail; ``champion`` None means there is no champion yet."""
    return [_check(rule, challenger.get(rule.metric), champion) for rule in rules]


def combined_gate(
    metrics: dict[str, float],
    thresholds: Sequence[Threshold],
    champion_metrics: dict[str, float] | None,
    rules: Sequence[ChampionRule],
) -> dict:
    """Absolute thresholds (``evaluate_gate``) and champion rules as one JSON-able result for XCom:
    ``{"passed", "checks": [{"kind": "threshold" | "champion", metric, value, min, max, passed, margin,
    ...}], "message"}``."""
    gate = evaluate_gate(metrics, thresholds)
    duel = champion_check(metrics, champion_metrics, rules)
    rows = [{"kind": "threshold", **asdict(c)} for c in gate.checks]
    rows += [{"kind": "champion", **asdict(c)} for c in duel]
    result = GateResult(gate.passed and all(c.passed for c in duel), tuple(gate.checks) + tuple(duel))
    return {"passed": result.passed, "checks": rows, "message": result.message()}


def message(result: dict) -> str:
    """The message of a ``combined_gate`` result (e.g. one read back from XCom): every breach, or every
    check when it passed."""
    checks = []
    for row in result["checks"]:
        cls = ChampionCheck if row.get("kind") == "champion" else Check
        keep = {f.name for f in fields(cls)}
        checks.append(cls(**{k: v for k, v in row.items() if k in keep}))
    return GateResult(result["passed"], tuple(checks)).message()


def production_metrics(spec: JobSpec, data: PreparedData) -> dict | None:
    """The ``production`` version's metrics on this run's eval data (its registered ONNX model, run with
    onnxruntime), or None when the model has no production version yet."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    from trainyard import recipes
    from trainyard.export.onnx_export import ExportFailed
    from trainyard.registry.signing import trusted_keys
    from trainyard.registry.versions import storage_uri, verify_version
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    try:
        mv = c.get_model_version_by_alias(spec.name, "production")
    except MlflowException:
        return None
    verify_version(c, spec.name, mv.version, trusted_keys())  # never compare against tampered files
    # The storage location itself, into a temp dir that goes with this call: a models:/ download writes a
    # metadata file into its destination, which must never be the artifact store.
    with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=storage_uri(c, spec.name, mv.version), dst_path=tmp, tracking_uri=c.tracking_uri
            )
        )
        onnx_file = next(iter(sorted(local.rglob("*.onnx"))), None)
        if onnx_file is None:
            raise ExportFailed(f"production version {mv.version} of {spec.name!r} has no ONNX model to compare with")
        recipe = recipes.get(spec.recipe)
        metrics = recipe.onnx_metrics(onnx_file, data, recipe.opts(spec))
    logging.getLogger(__name__).info(
        "champion: %s version %s on this run's val split: %s", spec.name, mv.version, metrics
    )
    return {**metrics, "_version": float(mv.version)}
