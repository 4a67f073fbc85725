"""Retraining jobs: a JobSpec plus when to train it again, one YAML file each in the jobs folder.

A job file is a JobSpec with two more keys, ``schedule`` (a cron expression and its timezone) and
``retrain_on: new_commits`` (a new commit on the branch that ``dataset.ref`` names). Each file becomes a DAG
``retrain_<file name>`` (``dags/retrain_jobs.py``) that pins the dataset commit it saw and starts a
``train_pipeline`` run on it, unless the newest registered version of the model was trained on that commit
with that very spec.

A new commit is announced as an Airflow asset event on the branch's asset, :func:`dataset_uri`: by the
``ingest_dataset`` DAG, by ``trainyard data upload``, or by anyone over REST.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainyard.data.store import NAME_RE
from trainyard.errors import PermanentError
from trainyard.spec import SPEC_DIGEST_TAG, JobSpec, SpecError, _Model, format_errors, spec_digest

JOB_FILE_SUFFIXES = (".yaml", ".yml")
# a DAG id is built from the file name: it must be one Airflow accepts and a person can read
JOB_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # whole names only (fullmatch)
COMMIT_RE = re.compile(r"[0-9a-f]{64}")  # a commit id of either store, in full
DAG_PREFIX = "retrain_"
# the two keys a job file adds to a JobSpec
JOB_KEYS = ("schedule", "retrain_on")


class JobFileError(PermanentError):
    """A job file that cannot become a DAG; the message names the file and each bad field."""


class Schedule(_Model):
    """When the job trains again on the clock."""

    cron: str = Field(description="a five-field cron expression, e.g. '0 3 * * 1' (Mondays at 03:00)")
    timezone: str = Field("UTC", description="the IANA timezone the cron expression is read in")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str) -> str:
        from croniter import croniter

        if len(cron.split()) != 5 or not croniter.is_valid(cron):
            raise ValueError("not a five-field cron expression (minute hour day-of-month month day-of-week)")
        return cron

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, timezone: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # "America" is a folder of the tz database
            raise ValueError("not an IANA timezone name such as 'UTC' or 'Europe/Berlin'") from None
        return timezone


class RetrainingJob(_Model):
    """One job file: what to train (the JobSpec) and when to train it again."""

    name: str = Field(description="the file's name without its suffix; the DAG is retrain_<name>")
    schedule: Schedule | None = None
    retrain_on: Literal["new_commits"] | None = Field(
        None, description="new_commits: train again when the branch named by dataset.ref gets a new commit"
    )
    spec: JobSpec

    @model_validator(mode="after")
    def _has_a_trigger(self) -> RetrainingJob:
        if self.schedule is None and self.retrain_on is None:
            raise ValueError("a job file needs a schedule, retrain_on, or both (else it would never run)")
        if self.retrain_on and not re.fullmatch(NAME_RE, self.spec.dataset.ref):
            raise ValueError(
                f"retrain_on needs dataset.ref to name a branch (letters, digits, '.', '_', '-'; at most 63), "
                f"got {self.spec.dataset.ref!r}"
            )
        return self

    @property
    def dag_id(self) -> str:
        return DAG_PREFIX + self.name

    @property
    def dataset_uri(self) -> str:
        ds = self.spec.dataset
        return dataset_uri(ds.store, ds.repo, ds.ref)


def jobs_folder() -> Path:
    """Where job files are read: ``TRAINYARD_JOBS_DIR``, else ``$TRAINYARD_HOME/jobs``."""
    from trainyard import paths

    folder = os.environ.get("TRAINYARD_JOBS_DIR")
    return Path(folder).resolve() if folder else paths.home() / "jobs"


def dataset_uri(store: str, repo: str, branch: str) -> str:
    """The Airflow asset of one branch of a dataset: its events announce the branch's new commits."""
    return f"trainyard://datasets/{store}/{repo}/{branch}"


def read_job_file(path: Path) -> RetrainingJob:
    """A job file as a RetrainingJob, or JobFileError naming the file and every bad field."""
    import yaml

    name = path.name.removesuffix(path.suffix)
    if not JOB_NAME_RE.fullmatch(name):
        raise JobFileError(
            f"{path}: the file name {name!r} makes the DAG id; use lower-case letters, digits, '_' or '-' "
            "(at most 63, starting with a letter or digit)"
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise JobFileError(f"{path}: not readable as YAML: {err}") from None
    if not isinstance(raw, dict):
        raise JobFileError(f"{path}: expected a mapping (a JobSpec plus schedule and/or retrain_on)")
    job = {k: raw.pop(k) for k in JOB_KEYS if k in raw}
    try:
        return RetrainingJob.model_validate({"name": name, **job, "spec": raw})
    except ValidationError as err:
        # one pass, so a bad cron and a bad JobSpec field are told together; the JobSpec's fields are the
        # file's own top-level keys, so they are named without the model's "spec." prefix
        problems = format_errors(err).replace("invalid JobSpec:", "invalid job file:").replace("\n  spec.", "\n  ")
        raise JobFileError(f"{path}: {problems}") from None


def load_jobs_folder(folder: Path | None = None) -> tuple[list[RetrainingJob], dict[str, str]]:
    """Every job file of ``folder`` (default :func:`jobs_folder`): the jobs that are valid, and the error of
    each file that is not (by path). A missing folder holds no jobs."""
    folder = folder or jobs_folder()
    found = folder.iterdir() if folder.is_dir() else iter(())
    files = sorted(p for p in found if p.suffix in JOB_FILE_SUFFIXES and p.is_file())
    jobs: dict[str, tuple[RetrainingJob, Path]] = {}
    errors: dict[str, str] = {}
    for path in files:
        try:
            job = read_job_file(path)
        except JobFileError as err:
            errors[str(path)] = str(err)
            continue
        except Exception as err:  # noqa: BLE001 - one file's surprise must not take the other jobs' DAGs down
            errors[str(path)] = f"{path}: could not be read as a job file: {type(err).__name__}: {err}"
            continue
        if job.name in jobs:  # digits.yaml beside digits.yml: one DAG id for two files
            errors[str(path)] = f"{path}: the DAG {job.dag_id} is already made from {jobs[job.name][1]}"
        else:
            jobs[job.name] = (job, path)
    return [job for job, _ in jobs.values()], errors


def pinned(spec: JobSpec, commit: str) -> JobSpec:
    """``spec`` to train on exactly ``commit`` (its branch, or whatever ``dataset.ref`` named, resolved)."""
    return spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"ref": commit})})


def commit_from_events(events: list[dict[str, Any]], job: RetrainingJob) -> str | None:
    """The commit to train on from the asset events that triggered a run (oldest first; events posted while
    a run was active are merged into the next one): the newest event's ``commit``, if it names one.
    Every event must be about the job's own branch; one that names another repo or branch, or a commit
    that is no full commit id, is refused (an event's ``extra`` is whatever its poster wrote)."""
    ds = job.spec.dataset
    for event in events:
        for key, expected in (("store", ds.store), ("repo", ds.repo), ("branch", ds.ref)):
            if key in event and event[key] != expected:
                raise SpecError(
                    f"an asset event for {job.dataset_uri} names {key} {event[key]!r}, not {expected!r}: "
                    "post events to the asset of the branch they are about"
                )
    commits = [e["commit"] for e in events if e.get("commit") is not None]
    for commit in commits:
        if not isinstance(commit, str) or not COMMIT_RE.fullmatch(commit):
            raise SpecError(
                f"an asset event for {job.dataset_uri} names commit {str(commit)[:80]!r}: an event must name a "
                "full commit id (64 hex digits), or none to train the branch head"
            )
    return commits[-1] if commits else None


def on_branch(store: Any, repo: str, branch: str, commit: str, limit: int = 100_000) -> bool:
    """Whether ``commit`` is the head of ``branch`` or one of its ancestors (at most ``limit`` commits
    looked at): an event may only name a commit of the branch its asset stands for."""
    todo, seen = [store.resolve(repo, branch)], set[str]()
    while todo and len(seen) < limit:
        current = todo.pop()
        if current == commit:
            return True
        if current not in seen:
            seen.add(current)
            todo.extend(store.get_commit(repo, current).parents)
    return False


def already_decided(spec: JobSpec) -> str | None:
    """Why ``spec`` (pinned to a commit) need not be trained, or None when it must be: the model's newest
    registered version was trained on that commit from that very spec, or a run of that commit and spec
    was already stopped by its gate (the same data and spec would meet the same gate again). Triggering
    ``train_pipeline`` by hand trains it regardless."""
    from trainyard.registry.mlflow_registry import newest_version
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.tracking.mlflow_tracking import quote

    c, digest, commit = mt.client(), spec_digest(spec), spec.dataset.ref
    version = newest_version(c, spec.name)
    tags = (version.tags or {}) if version is not None else {}
    if version is not None and tags.get("dataset.commit") == commit and tags.get(SPEC_DIGEST_TAG) == digest:
        return (
            f"{spec.name} version {version.version} was trained on commit {commit[:12]} from this same spec: "
            "nothing to train (change the data or the job file to train again)"
        )
    experiment = c.get_experiment_by_name(spec.name)
    if experiment is None:
        return None
    stopped = c.search_runs(
        [experiment.experiment_id],
        f"tags.`{SPEC_DIGEST_TAG}` = {quote(digest)} and tags.`dataset.commit` = {quote(commit)} "
        "and tags.`gate.passed` = 'false'",
        max_results=1,
    )
    if stopped:
        run_key = stopped[0].data.tags.get("trainyard.run_key", stopped[0].info.run_id)
        return (
            f"run {run_key} trained commit {commit[:12]} from this same spec and its gate stopped the model: "
            "nothing to train (change the data or the job file, or trigger train_pipeline to try again)"
        )
    return None


def plan_retraining(job: RetrainingJob, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run of ``job``'s DAG trains: the commit the triggering asset events name (the newest), else
    the head of ``dataset.ref`` now; and, in ``skip``, why it need not train at all (else None)."""
    from trainyard.data.stores import open_store
    from trainyard.datasets import check_job_access
    from trainyard.pipeline.data import resolve_dataset

    ds = job.spec.dataset
    named = commit_from_events(events, job)
    if named is None:  # the head now (a built-in source is ingested first, as a training run would)
        commit = resolve_dataset(job.spec).commit
    else:
        store = open_store(ds.store)
        check_job_access(store, job.spec)  # a repository of the job's team, or public, as for a training
        if not on_branch(store, ds.repo, ds.ref, named):
            raise SpecError(
                f"an asset event for {job.dataset_uri} names commit {named[:12]}, which is not on that branch"
            )
        commit = named
    spec = pinned(job.spec, commit)
    return {
        "conf": spec.model_dump(mode="json"),
        "commit": commit,
        "events": len(events),
        "skip": already_decided(spec),
    }
