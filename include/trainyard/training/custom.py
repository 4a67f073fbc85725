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
  every numeric field but ``step`` is a metric. The platform logs them to MLflow and gates on the last
  value of each.
"""

from __future__ import annotations

import json
import math
import posixpath
import stat
from pathlib import Path

from trainyard.errors import PermanentError

METRICS_FILE = "metrics.jsonl"
WORK_DIR = "work"  # in the run directory: all the program may write


def work_dir(run_dir: str) -> str:
    """Where the program of the run in ``run_dir`` writes (a POSIX path: the pods' as well as this host's)."""
    return posixpath.join(run_dir, WORK_DIR)


def platform_env(data_dir: str, run_dir: str) -> dict[str, str]:
    """The four TRAINYARD_* variables of the contract above, for a run directory and the prepared data as
    the program sees them (this machine's paths locally, the shared volume's paths in a pod): the one
    definition both launchers use."""
    work = work_dir(run_dir)
    return {
        "TRAINYARD_DATA_DIR": data_dir,
        "TRAINYARD_CHECKPOINT_DIR": posixpath.join(work, "checkpoints"),
        "TRAINYARD_OUTPUT_DIR": work,
        "TRAINYARD_METRICS_FILE": posixpath.join(work, METRICS_FILE),
    }


def output_file(run_dir: Path, name: str) -> Path | None:
    """The program's output ``name`` as a regular file, None if it wrote none; a link or anything but a
    regular file is refused (the platform reads it with its own rights, and must read the program's file
    only, never what a link points at)."""
    path = Path(work_dir(str(run_dir))) / name
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        raise PermanentError(
            f"{path} is not a regular file of its own (a symbolic or hard link, a pipe?): the custom command "
            f"must write {name} itself"
        )
    return path


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

    metrics_path = output_file(run_dir, METRICS_FILE)
    rows = read_metrics(metrics_path) if metrics_path else []
    if not rows:
        raise ValueError(
            f"the custom command reported no metrics in {Path(work_dir(str(run_dir))) / METRICS_FILE}; "
            "see trainyard.training.custom for the format"
        )
    metrics = [Metric(name, value, 0, step) for step, name, value in rows]
    for i in range(0, len(metrics), 1000):
        client.log_batch(mlflow_run_id, metrics=metrics[i : i + 1000])
    final: dict[str, float] = {}
    for _step, name, value in sorted(rows, key=lambda r: r[0]):
        final[name] = value
    onnx_path = output_file(run_dir, "model.onnx")
    return {
        "final_metrics": final,
        "steps": max(r[0] for r in rows),
        "model_path": None,
        "onnx_path": str(onnx_path) if onnx_path else None,
    }
