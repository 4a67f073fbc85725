"""``trainyard replay MODEL VERSION``: train a registered version again from what it recorded (its whole
spec, its dataset commit), through the queue like any run, and put the new metrics beside the recorded ones.

Where the replay trains, before it trains, the training task compares its own code version and installed
dependency set with the version's (:func:`check_environment`, from ``pipeline.start_tracking``): a
difference fails the run (naming each changed package) unless the spec's ``replay_exact`` is false, and
then the run records what differs (tag :data:`DIFFERENCES_TAG`). It is the worker's environment that
counts, not the one the command is typed in. A replay run trains and evaluates, and registers nothing
(``replay_of`` in its spec).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from trainyard.errors import CommandError, NotFoundError, PermanentError

DIFFERENCES_TAG = "replay.differences"  # on a replay's MLflow run: how its environment differed ("none")
TAG_LIMIT = 5000  # characters of an MLflow tag value

# What a replay must match, by where it trained: on CPU the same code, libraries, data and seed give the same
# bits (measured: the reproducibility table of docs/jobs.md); GPU kernels (cuDNN, atomics in reductions) may not.
CPU_TOLERANCE = 0.0
GPU_TOLERANCE = 5e-3


@dataclass(frozen=True)
class Recorded:
    """What a registered version recorded of its training."""

    model: str
    version: str
    run_id: str
    spec: dict
    commit: str
    code_version: str | None
    dependencies: list[str] | None
    dependencies_sha256: str | None
    metrics: dict[str, float]
    trainer_dependencies: list[str] | None = None  # what its trainer had (in a pod: the image's)
    rounded: frozenset[str] = frozenset()  # metrics known only as the version's tag, to 6 significant digits


def recorded(c, model: str, version: str) -> Recorded:
    """The version's record, or NotFoundError / CommandError saying why it cannot be replayed."""
    from mlflow.exceptions import MlflowException

    from trainyard.environment import DEPENDENCIES_ARTIFACT, DEPENDENCIES_TAG, TRAINER_ARTIFACT
    from trainyard.tracking.mlflow_tracking import read_artifact

    try:
        mv = c.get_model_version(model, str(version))
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise  # the registry away for a moment: a retry may find it
        raise NotFoundError(f"{model} version {version}: {err.message}") from None
    spec = read_artifact(c, mv.run_id, "spec/job_spec.json")
    if spec is None:
        raise CommandError(
            f"{model} version {version} recorded no spec (registered before trainyard kept one with each run): "
            "it cannot be replayed exactly"
        )
    deps = read_artifact(c, mv.run_id, DEPENDENCIES_ARTIFACT)
    trainer = read_artifact(c, mv.run_id, TRAINER_ARTIFACT)
    run = c.get_run(mv.run_id)
    tags = mv.tags or {}
    names = [k.removeprefix("metric.") for k in tags if k.startswith("metric.")]
    logged = run.data.metrics  # evaluate's values at full precision, as eval_<metric>
    return Recorded(
        model=model,
        version=str(version),
        run_id=mv.run_id,
        spec=json.loads(spec),
        commit=tags["dataset.commit"],
        code_version=tags.get("code_version"),
        dependencies=deps.split() if deps is not None else None,
        dependencies_sha256=tags.get(DEPENDENCIES_TAG),
        metrics={m: float(logged.get(f"eval_{m}", tags[f"metric.{m}"])) for m in names},
        rounded=frozenset(m for m in names if f"eval_{m}" not in logged),  # registered before eval_* was logged
        trainer_dependencies=trainer.split() if trainer is not None else None,
    )


def trainer_dependencies(rec: Recorded) -> list[str]:
    """What a replay's trainer must have: the version's trainer's set, or, for a version recorded before
    trainers wrote theirs, the set of the worker that trained it (CommandError if neither was recorded)."""
    found = rec.trainer_dependencies if rec.trainer_dependencies is not None else rec.dependencies
    if found is None:
        raise CommandError(
            f"{rec.model} version {rec.version} recorded no dependency set: it cannot be replayed exactly"
        )
    return found


def identifies_code(version: str | None) -> bool:
    """Whether a recorded code version names one code exactly: not ``unknown`` nor a bare ``-dirty`` (what
    trainyard recorded before it digested the changes), which two different trees could share."""
    return bool(version) and version != "unknown" and not str(version).endswith("-dirty")


def differences(rec: Recorded, code_version: str, dependencies: list[str]) -> list[str]:
    """How this environment differs from the one ``rec`` trained in, one line each (empty: none)."""
    from trainyard import environment

    out = []
    if rec.code_version != code_version or not identifies_code(code_version):
        out.append(f"code version: recorded {rec.code_version}, here {code_version}")
    if rec.dependencies_sha256 != environment.digest(dependencies):
        if rec.dependencies is None:
            out.append("dependencies: the version recorded no list to compare with")
        else:
            out += [f"dependency {line}" for line in environment.differences(rec.dependencies, dependencies)]
    return out


def check_environment(c, replay_of: str, exact: bool, code_version: str, dependencies: list[str]) -> str:
    """In the replay's training task: how this environment differs from the one the version ``replay_of``
    (``MODEL:VERSION``) trained in, as :data:`DIFFERENCES_TAG`'s value ("none", or a line each).
    ``exact``: a difference is a PermanentError naming each, and nothing trains."""
    model, version = replay_of.rsplit(":", 1)
    different = differences(recorded(c, model, version), code_version, dependencies)
    if different and exact:
        raise PermanentError(  # one line: a task's failure is shown by its first line (notices, the log's summary)
            f"this worker's environment differs from the one {model} version {version} trained in, so the replay "
            f"would not be exact (`trainyard replay --allow-different` trains anyway): {'; '.join(different)}"
        )
    text = "\n".join(different) or "none"
    return text if len(text) <= TAG_LIMIT else text[: TAG_LIMIT - 20] + "\n... (more)"


def _run_of(c, experiment: str, run_key: str):
    """The MLflow run of the pipeline run ``run_key`` in ``experiment``, None if there is none."""
    from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG, quote

    found = c.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = c.search_runs([found.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = {quote(run_key)}", max_results=1)
    return runs[0] if runs else None


def differences_of_run(c, experiment: str, run_key: str) -> list[str]:
    """What the replay run ``run_key`` recorded of its environment's differences (none, or no such run)."""
    run = _run_of(c, experiment, run_key)
    text = run.data.tags.get(DIFFERENCES_TAG, "none") if run else "none"
    return [] if text == "none" else text.splitlines()


def evaluated(c, experiment: str, run_key: str) -> dict[str, float]:
    """The metrics ``evaluate`` logged on the MLflow run of the replay run ``run_key`` (``eval_<metric>``:
    the platform's record, not the task's XCom); none if it did not evaluate."""
    run = _run_of(c, experiment, run_key)
    logged = run.data.metrics if run else {}
    return {name.removeprefix("eval_"): value for name, value in logged.items() if name.startswith("eval_")}


def replay_conf(rec: Recorded, exact: bool = True) -> dict[str, Any]:
    """The spec to run: the recorded one, on the recorded commit, marked as a replay of the version;
    ``exact``: its training refuses an environment that differs (:func:`check_environment`)."""
    from trainyard.spec import parse_spec

    spec = parse_spec({**rec.spec, "replay_of": f"{rec.model}:{rec.version}", "replay_exact": exact})
    pinned = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"ref": rec.commit})})
    return pinned.model_dump(mode="json")


def default_tolerance(rec: Recorded) -> float:
    return CPU_TOLERANCE if rec.spec.get("resources", {}).get("gpu_type", "cpu") == "cpu" else GPU_TOLERANCE


def compare(
    recorded_metrics: dict[str, float],
    replayed: dict[str, float],
    tolerance: float,
    rounded: frozenset[str] = frozenset(),
) -> tuple[bool, str]:
    """Whether every recorded metric came back within ``tolerance`` (absolute), and the table that says so.
    A metric in ``rounded`` was recorded to 6 significant digits: the replayed value is rounded alike."""
    rows = [("metric", "recorded", "replayed", "|difference|", "within")]
    ok = True
    for name in sorted(recorded_metrics):
        before, after = recorded_metrics[name], replayed.get(name)
        if after is None or not math.isfinite(after):
            rows.append((name, f"{before:.10g}", "missing", "-", "no"))
            ok = False
            continue
        if name in rounded:
            after = float(f"{after:.6g}")
        diff = abs(after - before)
        within = diff <= tolerance
        ok = ok and within
        rows.append((name, f"{before:.10g}", f"{after:.10g}", f"{diff:.3g}", "yes" if within else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return ok, f"{table}\ntolerance: {tolerance:g} (absolute)"
