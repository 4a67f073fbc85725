"""MLflow runs keyed by the Airflow DAG run, so retries reuse the same MLflow run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path

from trainyard import paths
from trainyard.errors import PermanentError
from trainyard.tracking import mlflow_auth
from trainyard.tracking.mlflow_auth import TEAM_TAG

# The one name of a run's identity (its run key: "<dag_id>/<run_id>" for an Airflow run), on the MLflow run
# and on the model version registered from it; retries find both by it.
RUN_KEY_TAG = "trainyard.run_key"
# The view MLflow's UI opens an experiment in (MLflow 3 opens one without it in its GenAI view: traces,
# token usage): trainyard's experiments train models
EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


_CREATED: set[str] = set()  # SQLite stores this process has seen created

# Where people open MLflow's UI (its server, as their browser reaches it): the links of the Airflow UI.
UI_URL_ENV, UI_URL_DEFAULT = "TRAINYARD_MLFLOW_URL", "http://localhost:5000"


def ui_url() -> str:
    """The MLflow UI's address (``TRAINYARD_MLFLOW_URL``; empty: no MLflow links)."""
    return os.environ.get(UI_URL_ENV, UI_URL_DEFAULT).rstrip("/")


def run_page(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI at ``base``."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def model_version_page(base: str, name: str, version: int | str) -> str:
    """A registered model version's page in the MLflow UI at ``base``."""
    from urllib.parse import quote

    return f"{base}/#/models/{quote(str(name), safe='')}/versions/{quote(str(version))}"


def client(tracking_uri: str | None = None):
    """An MLflow client of the tracking store. A SQLite store is created under a file lock: MLflow
    creates its tables on first use, and two processes doing that at once (a sweep's first trials)
    fail with "table ... already exists"."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or paths.mlflow_tracking_uri()
    if not uri.startswith("sqlite:///") or uri in _CREATED:
        return MlflowClient(uri)
    from trainyard.files import file_lock

    db = Path(uri.removeprefix("sqlite:///"))
    with file_lock(db.with_name(f".{db.name}.create.lock")):
        c = MlflowClient(uri)
        c.search_experiments(max_results=1)  # the store made (its tables created) here, one process at a time
        c._get_registry_client().store  # noqa: B018 - and the registry's, on the same database
    _CREATED.add(uri)
    return c


def quote(value: str) -> str:
    """A value for an MLflow filter string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ExperimentOfAnotherTeam(PermanentError):
    """A job's experiment (its name's) belongs to another team."""


def experiment_owner(c, name: str) -> str | None:
    """The team that owns experiment ``name`` (its tag :data:`TEAM_TAG`); None: no such experiment, or
    one from before owners were recorded (the next job to use it records its team)."""
    exp = c.get_experiment_by_name(name)
    return None if exp is None else (exp.tags or {}).get(TEAM_TAG)


def experiment_id(c, name: str, team: str) -> str:
    """The id of experiment ``name`` for a job of ``team``: made as the team's when there is none (it and its
    runs are then readable by the team's members on a tracking server with MLflow's auth app,
    :mod:`trainyard.tracking.mlflow_auth`); ExperimentOfAnotherTeam when another team owns it."""
    from mlflow.exceptions import MlflowException

    exp = c.get_experiment_by_name(name)
    if exp is None:
        root = paths.mlflow_artifact_root()
        try:
            made = c.create_experiment(
                name,
                artifact_location=f"{root}/{name}" if root else None,
                tags={**mlflow_auth.sealed("experiment", name, team), EXPERIMENT_KIND_TAG: MODEL_TRAINING},
            )
            mlflow_auth.grant_team_read(team, experiment_id=made)
            return made
        except MlflowException:  # created concurrently by another task
            exp = c.get_experiment_by_name(name)
    owner = (exp.tags or {}).get(TEAM_TAG)
    if owner is None:  # made before owners were recorded: the first job since records its team
        mlflow_auth.check_sealed("experiment", name, team, {})  # with the auth app: only after `sync`
        c.set_experiment_tag(exp.experiment_id, TEAM_TAG, team)
        mlflow_auth.grant_team_read(team, experiment_id=exp.experiment_id)
    elif owner != team:
        raise ExperimentOfAnotherTeam(
            f"name: the MLflow experiment {name!r} belongs to team {owner!r}; a job of team {team!r} cannot log "
            "runs into it (job names are one namespace for every team): give the job another name"
        )
    else:
        mlflow_auth.check_sealed("experiment", name, team, exp.tags or {})
    if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) is None:  # made before the kind was recorded
        c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return exp.experiment_id


def ensure_run(c, experiment: str, run_key: str, run_name: str, team: str, tags: dict[str, str]) -> str:
    """The MLflow run for ``run_key`` (an Airflow dag_id/run_id) of a job of ``team``, created on first call
    only, in the team's experiment ``experiment``."""
    exp_id = experiment_id(c, experiment, team)
    found = c.search_runs([exp_id], filter_string=f"tags.`{RUN_KEY_TAG}` = {quote(run_key)}", max_results=1)
    if found:
        return found[0].info.run_id
    run = c.create_run(exp_id, run_name=run_name, tags={RUN_KEY_TAG: run_key, TEAM_TAG: team, **tags})
    return run.info.run_id


def log_params(c, run_id: str, params: dict) -> None:
    """Flattened params (``hyperparameters.epochs``); existing equal values are left alone."""
    from mlflow.entities import Param

    flat: dict[str, str] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = str(obj)[:6000]

    walk("", params)
    existing = c.get_run(run_id).data.params
    todo = [Param(k, v) for k, v in flat.items() if k not in existing]
    for i in range(0, len(todo), 100):
        c.log_batch(run_id, params=todo[i : i + 100])


def code_version(repo_dir: str | Path | None = None) -> str:
    """What code runs, such that two runs with the same answer ran the same code: the git commit, with
    ``-dirty.<digest>`` of the uncommitted changes (``git diff HEAD`` and the untracked files that git does not
    ignore) where there are any; without git (a trainer image, an installed package) ``files.<digest>`` of
    the ``trainyard`` package's own source files."""
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[3]
    try:
        sha = _git(cwd, "rev-parse", "HEAD").decode().strip()
        changes = _git(cwd, "diff", "HEAD", "--binary")
        untracked = _git(cwd, "ls-files", "-z", "--others", "--exclude-standard").split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return f"files.{_source_digest(Path(__file__).resolve().parents[1])}"
    h = hashlib.sha256(changes)
    for name in filter(None, untracked):
        with contextlib.suppress(OSError):  # gone meanwhile, or not a file
            h.update(b"\0" + name + b"\0" + (cwd / os.fsdecode(name)).read_bytes())
    return sha + (f"-dirty.{h.hexdigest()[:16]}" if changes or any(untracked) else "")


def _git(cwd: Path, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout


def _source_digest(package: Path) -> str:
    """SHA-256 (first 16 hex digits) over the path and content of every ``.py`` file under ``package``."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def read_artifact(c, run_id: str, path: str) -> str | None:
    """The text of one artifact of a run, or None when the run has no such file."""
    import tempfile

    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as tmp:
        try:
            return Path(c.download_artifacts(run_id, path, tmp)).read_text()
        except (MlflowException, OSError):
            return None
