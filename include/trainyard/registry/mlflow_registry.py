"""MLflow Model Registry: one version per DAG run, with signature, input example and lineage tags."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG, quote


def find_version(c, model_name: str, run_key: str):
    from mlflow.exceptions import MlflowException

    try:
        found = c.search_model_versions(f"name = {quote(model_name)} and tags.`{RUN_KEY_TAG}` = {quote(run_key)}")
    except MlflowException:
        return None
    return found[0] if found else None


def register_onnx(
    c,
    *,
    model_name: str,
    run_id: str,
    run_key: str,
    onnx_path: str | Path,
    extra_artifacts: dict[str, str | Path],
    input_example: np.ndarray | dict[str, np.ndarray],
    tags: dict[str, str],
    alias: str | None = "staging",
) -> dict:
    """Log the ONNX model to ``run_id`` and register it as a version of ``model_name``, which must exist (its
    owner made it: :func:`trainyard.registry.ownership.claim`).

    ``extra_artifacts`` (subdir -> a file or a folder: the PyTorch weights, a tokenizer) go into the logged
    model's own artifacts, next to the
    ONNX file, so they are part of the version's files: downloaded with it, and covered by its signature.

    If this DAG run already has a version (a retry, or a re-run of the task), that version is returned
    and nothing new is created."""
    import mlflow
    import onnx
    from mlflow.models import infer_signature

    existing = find_version(c, model_name, run_key)
    if existing is not None:
        if alias:
            c.set_registered_model_alias(model_name, alias, existing.version)
        return {"name": model_name, "version": int(existing.version), "created": False, "source": existing.source}

    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from trainyard.export.onnx_export import onnx_session

    session = onnx_session(onnx_path)
    feeds = input_example if isinstance(input_example, dict) else {session.get_inputs()[0].name: input_example}
    outputs = dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds), strict=True))
    signature = infer_signature(input_example, outputs if len(outputs) > 1 else next(iter(outputs.values())))
    # log_model works on the active run of the global tracking URI: point it at our store for this call
    # only, so no later caller in the process (another task, a test) silently talks to this store.
    with _use_tracking_uri(c.tracking_uri), mlflow.start_run(run_id=run_id):
        # The requirements are named, not inferred: inference loads the model in a subprocess to watch its
        # imports (1.4 to 2.5 s of every registration) and finds what onnx's flavour names anyway.
        info = mlflow.onnx.log_model(
            onnx.load(str(onnx_path)),
            name="model",
            signature=signature,
            input_example=input_example,
            pip_requirements=mlflow.onnx.get_default_pip_requirements(),
        )
        for subdir, path in extra_artifacts.items():
            if Path(path).is_dir():  # every file of the folder, under subdir
                c.log_model_artifacts(info.model_id, str(path), artifact_path=subdir)
            else:
                c.log_model_artifact(info.model_id, str(path), artifact_path=subdir)
    # The run tag goes in with the version itself, so no crash can leave an untagged duplicate.
    with _use_tracking_uri(c.tracking_uri):  # a models:/ source is resolved through the global URI
        # model_id too: a tracking server (the cluster profile's) refuses a models:/ source without it
        mv = c.create_model_version(
            model_name,
            source=info.model_uri,
            run_id=run_id,
            tags={RUN_KEY_TAG: run_key, **tags},
            model_id=info.model_id,
        )
    if alias:
        c.set_registered_model_alias(model_name, alias, mv.version)
    return {"name": model_name, "version": int(mv.version), "created": True, "source": info.model_uri}


def newest_version(c, model_name: str):
    """The registered model's version with the highest number, or None when it has none."""
    found = c.search_model_versions(f"name = {quote(model_name)}", max_results=1, order_by=["version_number DESC"])
    return found[0] if found else None
