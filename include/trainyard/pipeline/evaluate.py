"""Stage 4, evaluation and the gate: the recipe's metrics on the held-out splits, then the thresholds and
champion rules that decide whether the model goes on to export and registration.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainyard.pipeline.records import PreparedData, TrainingResult
from trainyard.spec import JobSpec

log = logging.getLogger(__name__)


def evaluate(spec: JobSpec, trained: TrainingResult, data: PreparedData) -> dict:
    """The recipe's metrics on the val (and test) split; a custom command's are the last values it
    reported, read again from its metrics file (not from the training's XCom). Logged to the MLflow run as
    ``eval_<metric>`` (what ``trainyard replay`` compares); metric signatures (BLEU tokenizer, COCO
    evaluator) become run tags ``eval.*``. The DAG records them for the gate and the registration
    (:func:`trainyard.pipeline.records.record_evaluation`)."""
    from trainyard import recipes
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.training import custom

    info: dict[str, str] = {}
    if spec.recipe == "custom":  # the program measured itself; the gate reads its last reports
        metrics = custom.collect(Path(trained.run_dir))["final_metrics"]
    else:
        recipe = recipes.get(spec.recipe)
        options = recipe.opts(spec)
        weights = trained.weights()
        metrics, info = recipe.evaluate(weights, data, "val", options)
        if data.test is not None:
            metrics.update(recipe.evaluate(weights, data, "test", options)[0])
    c = mt.client()
    for k, v in metrics.items():
        c.log_metric(trained.mlflow_run_id, f"eval_{k}", v)
    for k, tag in info.items():
        c.set_tag(trained.mlflow_run_id, f"eval.{k}", tag)
    log.info(
        "evaluation%s: %s %s", " (reported by the custom command)" if spec.recipe == "custom" else "", metrics, info
    )
    return metrics


def gate(spec: JobSpec, metrics: dict, data: PreparedData | None = None, trained: TrainingResult | None = None) -> dict:
    """Thresholds and champion/challenger rules; the full result (every metric, bound, margin) is returned
    for XCom and, with ``trained``, stored on its MLflow run (tags ``gate.*`` + gate_result.json) with the
    run's report (:mod:`trainyard.tracking.report`: curves PNG and one HTML page, pass or fail). The
    caller fails the run (``GateFailed``) if ``passed`` is false. ``validate_spec`` refuses champion
    rules for a custom recipe, so here every rule is measured."""
    from trainyard.evaluation.champion import combined_gate, production_metrics
    from trainyard.evaluation.gate_record import record_gate

    champion = production_metrics(spec, data) if spec.champion and data is not None else None
    result = combined_gate(metrics, spec.gates, champion, spec.champion)
    if champion is not None:
        result["champion_version"] = int(champion["_version"])
    if trained is not None:
        from trainyard.tracking import mlflow_tracking as mt
        from trainyard.tracking import report

        record_gate(trained.mlflow_run_id, trained.run_dir, result)
        try:
            report.write(mt.client(), trained.mlflow_run_id, trained.run_dir, result)  # passed or not
        except Exception:  # noqa: BLE001 - the report is a view of the run; the gate's verdict stands
            log.warning("could not write the run's report", exc_info=True)
    return result
