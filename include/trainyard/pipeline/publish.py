"""Stage 5, publishing: the ONNX export held to parity with PyTorch, and one signed MLflow model version
per run with its lineage, under the alias ``staging`` (a recorded, verified move).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from trainyard.export.onnx_export import ExportFailed
from trainyard.pipeline.records import ExportedModel, PinnedDataset, PreparedData, TrainingResult, lineage_tags
from trainyard.pipeline.spec import check_ownership
from trainyard.spec import JobSpec

log = logging.getLogger(__name__)


def export_onnx(spec: JobSpec, trained: TrainingResult, data: PreparedData) -> ExportedModel:
    """ONNX export of the trained model, held to parity with PyTorch and to its metric re-computed with
    onnxruntime (see the recipe); with ``export.torchscript``, a TorchScript file too."""
    from trainyard import recipes

    if spec.recipe == "custom":
        return check_custom_onnx(trained)
    recipe = recipes.get(spec.recipe)
    out = exported_model(recipe.export(trained.weights(), data, Path(trained.run_dir), spec.export, recipe.opts(spec)))
    p = out.parity
    if p is None:  # every built-in recipe's export holds the graph to PyTorch
        raise ExportFailed(f"{spec.recipe}'s export reported no parity with PyTorch")
    log.info(
        "ONNX parity on %d outputs: max |diff| %.3g, mismatched %d; %s torch %.4f onnx %.4f%s",
        p["total"],
        p["max_abs_diff"],
        p["mismatched"],
        out.metric,
        out.metric_torch,
        out.metric_onnx,
        f"; TorchScript {out.torchscript_path}" if out.torchscript_path else "",
    )
    return out


def exported_model(verdict: dict) -> ExportedModel:
    """A recipe's export verdict (``Recipe.export``: :func:`trainyard.recipes.shared.verify_export`'s dict,
    its metric under ``<metric>_torch`` and ``<metric>_onnx``) as the record; the keys it does not name
    are the recipe's own figures (``details``)."""
    m = verdict["metric"]
    named = {"onnx_path", "input_example", "torchscript_path", "artifacts", "parity", "torchscript_parity"}
    return ExportedModel(
        **{k: v for k, v in verdict.items() if k in named},
        metric=m,
        metric_torch=verdict[f"{m}_torch"],
        metric_onnx=verdict[f"{m}_onnx"],
        details={k: v for k, v in verdict.items() if k not in named | {"metric", f"{m}_torch", f"{m}_onnx"}},
    )


def check_custom_onnx(trained: TrainingResult) -> ExportedModel:
    """A custom command's model.onnx: valid ONNX that onnxruntime runs to finite outputs. (Parity with a
    framework model is the program's own business: the platform has no reference model for it.)"""
    import numpy as np
    import onnx

    from trainyard.export.onnx_export import onnx_session
    from trainyard.recipes.shared import save_input_example
    from trainyard.training import custom
    from trainyard.training.run_config import work_dir

    if not trained.onnx_path:
        raise ExportFailed(f"the custom command wrote no model.onnx into {work_dir(trained.run_dir)}")
    custom.check_external_data(Path(trained.onnx_path))
    onnx.checker.check_model(trained.onnx_path, full_check=True)
    session = onnx_session(trained.onnx_path)
    inp = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    example = np.zeros(shape, dtype=np.float32)
    out = session.run(None, {inp.name: example})[0]
    if not np.isfinite(out).all():
        raise ExportFailed(f"{trained.onnx_path} gives non-finite outputs on a zero input")
    return ExportedModel(
        onnx_path=trained.onnx_path,
        input_example=save_input_example(Path(trained.run_dir), {inp.name: example}),
    )


def _version_tags(
    spec: JobSpec,
    dataset: PinnedDataset,
    trained: TrainingResult,
    exported: ExportedModel,
    metrics: dict,
    run_tags: dict[str, str],
) -> dict[str, str]:
    """A model version's tags: its lineage, recipe, team and hyperparameters, where its files are, its
    metrics, and what the gate decided and how the metrics were computed (copied from its run)."""
    return {
        **lineage_tags(dataset),
        "recipe": spec.recipe,
        "team": spec.resources.team,  # whom a move of its aliases is told to
        "params": json.dumps(spec.hyperparameters.model_dump(mode="json"), sort_keys=True),
        "onnx_path": exported.onnx_path,
        "run_dir": trained.run_dir,
        **{f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()},
        **{k: v for k, v in run_tags.items() if k.startswith(("gate.", "eval.", "sweep.", "dependencies."))},
    }


def _sign(c, info: dict, run_key: str, user: str) -> dict:
    """Sign the version (a digest of every file and an Ed25519 signature over them: promote and rollback
    refuse a version whose files no longer match; re-signing the same content keeps the signature) and
    record its registration in the audit trail, once per version (a retried register finds its entry)."""
    from trainyard.audit import AuditLog
    from trainyard.registry.signing import load_private_key
    from trainyard.registry.versions import sign_version

    signed = sign_version(c, info["name"], info["version"], load_private_key())
    trail, version = AuditLog(), str(info["version"])
    if not any(e.get("model") == info["name"] and e.get("version") == version for e in trail.entries("registration")):
        trail.append(
            "registration",
            user,
            model=info["name"],
            version=version,
            run_key=run_key,
            manifest_sha256=signed["manifest_sha256"],
            key_id=signed["key_id"],
        )
    return {**info, "manifest_sha256": signed["manifest_sha256"], "signing_key_id": signed["key_id"]}


def register(
    spec: JobSpec,
    dataset: PinnedDataset,
    trained: TrainingResult,
    exported: ExportedModel,
    metrics: dict,
    run_key: str,
    extra_tags: dict[str, str] | None = None,
    user: str = "train_pipeline",
) -> dict:
    """One signed MLflow model version per DAG run: ONNX model (signature, input example), PyTorch weights
    (and TorchScript) beside it, lineage, metrics, metric signatures and the gate result as tags. ``user``:
    who triggered the run, the actor of the staging move in the audit trail."""
    from trainyard.recipes.shared import load_input_example
    from trainyard.registry.mlflow_registry import register_onnx
    from trainyard.registry.signing import trusted_keys
    from trainyard.registry.versions import promote
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    check_ownership(spec, c, claim=True)  # before anything is logged: a refused registration leaves nothing behind
    run_tags = c.get_run(trained.mlflow_run_id).data.tags
    tags = {**_version_tags(spec, dataset, trained, exported, metrics, run_tags), **(extra_tags or {})}
    artifacts: dict[str, str | Path] = {"pytorch": trained.model_path} if trained.model_path else {}
    if exported.torchscript_path:
        artifacts["torchscript"] = exported.torchscript_path
    artifacts.update(exported.artifacts)  # a recipe's files for the ONNX graph (a tokenizer)
    info = register_onnx(
        c,
        model_name=spec.name,
        run_id=trained.mlflow_run_id,
        run_key=run_key,
        onnx_path=exported.onnx_path,
        extra_artifacts=artifacts,
        input_example=load_input_example(exported.input_example),
        tags=tags,
        alias=None,  # set below, after signing, through the recorded (verified) alias move
    )
    info = _sign(c, info, run_key, user)
    promote(
        c,
        info["name"],
        info["version"],
        "staging",
        user=user,
        reason=f"registered by {run_key}",
        trusted=trusted_keys(),
    )
    log.info(
        "registered %s version %s (%s), signed by key %s",
        info["name"],
        info["version"],
        "new" if info["created"] else "existing",
        info["signing_key_id"],
    )
    return info
