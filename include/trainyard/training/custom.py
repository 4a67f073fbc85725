"""Bring your own training: a JobSpec with ``recipe: custom`` runs the user's command instead of a
built-in recipe, and the platform still provides the plumbing.

The contract with the user's program (the same locally and on Kubernetes):

- rendezvous: torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE); locally
  the command runs under ``torchrun --no-python`` with ``resources.gpus_per_node`` processes
  (:func:`trainyard.training.launchers.command.custom_argv`), in a pod once per node;
- ``TRAINYARD_DATA_DIR``: the prepared dataset (``manifest.json`` + train/val[/test] files);
- ``TRAINYARD_OUTPUT_DIR``: where to write ``model.onnx``, which the platform checks and registers; the
  only place the program may write (the run directory's ``work`` subdirectory, which also is its HOME
  locally; the platform's own files of the run are beside it, out of its reach);
- ``TRAINYARD_CHECKPOINT_DIR``: where to keep checkpoints, inside it (it survives a retry of the task);
- ``TRAINYARD_METRICS_FILE``: JSON lines, one object per report, ``{"step": 12, "train_loss": 0.3, ...}``;
  every numeric field but ``step`` is a metric. The platform relays them to MLflow and TensorBoard (while
  the program runs locally, when its pods end on Kubernetes; :mod:`trainyard.training.metrics`, the
  built-in trainers' format too) and gates on the last value of each. Append to it (open it with
  ``"a"``, also after a restart): a file rewritten from its start is relayed again from its start;
- ``TRAINYARD_HYPERPARAMETERS``: the JobSpec's ``hyperparameters`` section as a JSON object (a sweep
  trial's values in place), for the program to train with;
- in a sweep trial only, ``TRAINYARD_TRIAL_VERDICT_FILE``: the pruner's answer to the program's reports.
  Each report (metrics line) holding the sweep's objective is a reporting point, the first one 1, the
  next 2 (a line whose ``step`` is not above the last such line's is a repeat after a restart, not a new
  point): report the objective once per epoch. After a reporting point, the program may wait until the
  file holds ``{"epoch": n, "prune": ...}`` with ``n`` at least that point's number (within a second
  or so; written whole, by rename) and, if ``prune`` is true, exit 0 without a model. A program that does
  not look is stopped by the platform (:data:`trainyard.sweeps.trials.GRACE_S` after the pruner's word);
  the trial is pruned either way.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainyard.errors import PermanentError
from trainyard.training.metrics import METRICS_FILE, read_metrics
from trainyard.training.run_config import WorkerOutputError, output_file, work_dir

MAX_METRICS = 1000  # names of a custom program's metrics: each is kept with its run (and a sweep trial)


def platform_env(
    data_dir: str, run_dir: str, hyperparameters: Mapping[str, Any], *, trial: bool = False
) -> dict[str, str]:
    """The TRAINYARD_* variables of the contract above, for a run directory and the prepared data as the
    program sees them (this machine's paths locally, the shared volume's paths in a pod): the one
    definition both launchers use. ``trial``: the run is a sweep trial (the verdict file is named)."""
    from trainyard.training.handshake import VERDICT

    work = work_dir(run_dir)
    env = {
        "TRAINYARD_DATA_DIR": data_dir,
        "TRAINYARD_CHECKPOINT_DIR": posixpath.join(work, "checkpoints"),
        "TRAINYARD_OUTPUT_DIR": work,
        "TRAINYARD_METRICS_FILE": posixpath.join(work, METRICS_FILE),
        "TRAINYARD_HYPERPARAMETERS": json.dumps(dict(hyperparameters), sort_keys=True),
    }
    if trial:
        env["TRAINYARD_TRIAL_VERDICT_FILE"] = posixpath.join(work, VERDICT)
    return env


def check_external_data(model_path: Path) -> None:
    """A model.onnx may keep tensors in other files only beside it, by plain file name: a location that
    climbs out (``../``), is absolute, or is not a regular file would have the platform read, with its own
    rights, a file the program could not."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not location or location != posixpath.basename(location) or location in (".", ".."):
            raise PermanentError(
                f"{model_path}: tensor {tensor.name!r} keeps its data at {location!r}; external data must be "
                f"a file beside model.onnx, named without a directory"
            )
        output_file(model_path.parent.parent, location)  # a link or a pipe is refused


def collect(run_dir: Path) -> dict:
    """The last value of each of the program's metrics (the metrics file, which
    :func:`trainyard.training.metrics.relay` logs to MLflow) and where its model is."""
    metrics_file = Path(work_dir(str(run_dir))) / METRICS_FILE
    rows = read_metrics(metrics_file)
    if not rows:
        raise WorkerOutputError(
            f"the custom command reported no metrics in {metrics_file}; see trainyard.training.custom for the format"
        )
    final: dict[str, float] = {}
    for _step, name, value in sorted(rows, key=lambda r: r[0]):
        final[name] = value
    if len(final) > MAX_METRICS:
        raise WorkerOutputError(
            f"{metrics_file}: {len(final)} metric names; at most {MAX_METRICS} (they are recorded with the run)"
        )
    # NaN is a point of a curve, but not a result to gate on, record or register
    broken = {name: value for name, value in final.items() if not math.isfinite(value)}
    if broken:
        raise WorkerOutputError(
            f"{metrics_file}: the last value of {', '.join(f'{k} is {v}' for k, v in broken.items())}: a final "
            "metric must be a finite number"
        )
    onnx_path = output_file(run_dir, "model.onnx")
    return {
        "final_metrics": final,
        "steps": max(r[0] for r in rows),
        "model_path": None,
        "onnx_path": str(onnx_path) if onnx_path else None,
    }
