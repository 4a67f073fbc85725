"""Bring your own training: a JobSpec with ``recipe: custom`` runs the user's command instead of a
built-in recipe, and the platform still provides the plumbing.

The contract with the user's program (the same locally and on Kubernetes):

- rendezvous: torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE); locally
  the command runs under ``torchrun --no-python`` with ``resources.gpus_per_node`` processes
  (:func:`trainyard.training.launchers.command.custom_argv`), in a pod once per node;
- ``TRAINYARD_DATA_DIR``: the prepared dataset (``manifest.json`` + train/val[/test] files);
- ``TRAINYARD_CHECKPOINT_DIR``: where to keep checkpoints (it survives a retry of the task);
- ``TRAINYARD_OUTPUT_DIR``: where to write ``model.onnx``, which the platform checks and registers;
- ``TRAINYARD_METRICS_FILE``: JSON lines, one object per report, ``{"step": 12, "train_loss": 0.3, ...}``;
  every numeric field but ``step`` is a metric. The platform logs them to MLflow and gates on the last
  value of each.
"""

from __future__ import annotations

import json
import math
import posixpath
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def platform_env(data_dir: str, run_dir: str) -> dict[str, str]:
    """The four TRAINYARD_* variables of the contract above, for a run directory and the prepared data as
    the program sees them (this machine's paths locally, the shared volume's paths in a pod): the one
    definition both launchers use."""
    return {
        "TRAINYARD_DATA_DIR": data_dir,
        "TRAINYARD_CHECKPOINT_DIR": posixpath.join(run_dir, "checkpoints"),
        "TRAINYARD_OUTPUT_DIR": run_dir,
        "TRAINYARD_METRICS_FILE": posixpath.join(run_dir, METRICS_FILE),
    }


def read_metrics(path: str | Path) -> list[tuple[int, str, float]]:
    """(step, name, value) for every numeric field; a malformed line fails naming the file and line."""
    rows: list[tuple[int, str, float]] = []
    path = Path(path)
    if not path.exists():
        return rows
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{lineno}: expected a JSON object with an integer 'step' ({err})") from None
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise ValueError(f"{path}:{lineno}: metric {name!r} is {value}")
                rows.append((step, name, float(value)))
    return rows


def collect(run_dir: Path, client, mlflow_run_id: str) -> dict:
    """Log the program's metrics to MLflow; return the last value of each and where its model is."""
    from mlflow.entities import Metric

    rows = read_metrics(run_dir / METRICS_FILE)
    if not rows:
        raise ValueError(
            f"the custom command reported no metrics in {run_dir / METRICS_FILE}; "
            "see trainyard.training.custom for the format"
        )
    metrics = [Metric(name, value, 0, step) for step, name, value in rows]
    for i in range(0, len(metrics), 1000):
        client.log_batch(mlflow_run_id, metrics=metrics[i : i + 1000])
    final: dict[str, float] = {}
    for _step, name, value in sorted(rows, key=lambda r: r[0]):
        final[name] = value
    onnx_path = run_dir / "model.onnx"
    return {
        "final_metrics": final,
        "steps": max(r[0] for r in rows),
        "model_path": None,
        "onnx_path": str(onnx_path) if onnx_path.exists() else None,
    }
