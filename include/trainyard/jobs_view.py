"""The Jobs page's rows: each training run with what its team asks of it at a glance (the Airflow UI's Jobs
page, ``trainyard_airflow.pages``).

A run is listed to its team's members and admins only (another team's jobs are theirs: the Fleet page
shows what everyone may see of them; :func:`visible_runs`). Each row joins what is known of it in four
places: Airflow (the run, its tasks' states, its validated JobSpec and its registered version, read by the
plugin and handed in as :class:`AirflowRun`), the admission ledger (its place in its GPU type's queue and
why it waits, :func:`trainyard.scheduling.fleet_view.live_queue`, as ``trainyard queue`` says it), MLflow
(its run, and while it trains its latest epoch, throughput and ETA, which the training logs as curves), and
its run directory (what its finished tries cost, as the team's budget counts it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainyard.spec import slot_type_of

if TYPE_CHECKING:
    from trainyard.acting import Acting
    from trainyard.scheduling.admission.ledger import Ledger
    from trainyard.scheduling.resources import ResourcesConfig

log = logging.getLogger(__name__)

# What a run is doing, by the first of its tasks (in the pipeline's order) that is under way.
STAGES = (
    ("validate_spec", "checking its spec"),
    ("resolve_dataset", "pinning its data"),
    ("validate_data", "validating its data"),
    ("prepare_data", "preparing its data"),
    ("admit", "waiting for GPUs"),
    ("train", "training"),
    ("plan_kubernetes", "planning its pods"),
    ("train_kubernetes", "training on Kubernetes"),
    ("plan_sweep", "planning its sweep"),
    ("trial.admit", "trials waiting for GPUs"),
    ("trial.train_trial", "training its trials"),
    ("evaluate", "evaluating"),
    ("gate", "at its gate"),
    ("export_onnx", "exporting to ONNX"),
    ("register", "registering"),
)
UNDER_WAY = ("running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule")
PROGRESS_METRICS = ("epoch", "samples_per_second", "eta_seconds")


@dataclass(frozen=True)
class AirflowRun:
    """What Airflow knows of one run of a training DAG."""

    dag_id: str
    run_id: str
    state: str
    conf: Mapping[str, Any] | None = None
    note: str | None = None
    triggered_by: str | None = None  # the Airflow user who triggered it (None: a schedule, an asset)
    started: float | None = None  # epoch seconds
    tasks: Mapping[str, str] = field(default_factory=dict)  # task id -> the state of its latest try
    training_started: float | None = None  # the train task's current try, while it runs
    spec: Mapping[str, Any] | None = None  # validate_spec's XCom: the JobSpec as validated
    registered: Mapping[str, Any] | None = None  # register's XCom: the model version

    @property
    def key(self) -> str:
        """The run's name in the ledger, its run directory and its MLflow run's tag."""
        return f"{self.dag_id}/{self.run_id}"


@dataclass(frozen=True)
class Tracked:
    """A run's MLflow run: its id, experiment and latest value of each progress curve."""

    run_id: str
    experiment_id: str
    metrics: Mapping[str, float]


def _spec(run: AirflowRun) -> dict[str, Any] | None:
    """The run's JobSpec as a dict: as validated, else as its conf reads (None: its conf is refused)."""
    from trainyard.form import run_spec

    if run.spec:
        return dict(run.spec)
    spec = run_spec(run.dag_id, run.conf)
    return None if spec is None else spec.model_dump(mode="json")


def owner_team(run: AirflowRun) -> str | None:
    """The team whose run it is: its DAG's (a team's own DAG runs that team's jobs only), else, in the one
    DAG of an installation without teams in Airflow, the team of the spec its first task validated (which
    checked that the triggering user may run that team's jobs); None before that, or for a refused spec:
    then the conf's team is only a claim."""
    from trainyard.teams import team_of_dag

    validated = (run.spec or {}).get("resources")
    return team_of_dag(run.dag_id) or (validated.get("team") if isinstance(validated, Mapping) else None)


def visible_runs(runs: Sequence[AirflowRun], reader: Acting) -> list[AirflowRun]:
    """The runs ``reader`` may see, in their order: their teams' (:func:`owner_team`), and a run of no team
    yet (refused, or not validated yet) to the user who triggered it and to admins."""
    seen = []
    for run in runs:
        team = owner_team(run)
        if (
            reader.may_read(team)
            if team
            else reader.admin or (reader.user is not None and reader.user == run.triggered_by)
        ):
            seen.append(run)
    return seen


def _stage(run: AirflowRun) -> str:
    if run.state != "running":
        return run.state
    for task, words in STAGES:
        if run.tasks.get(task) in UNDER_WAY:
            return words
    return "running"


def _progress(tracked: Tracked | None, spec: Mapping[str, Any], training: bool) -> dict[str, Any] | None:
    if tracked is None or not training:
        return None
    m = {k: v for k in PROGRESS_METRICS if (v := tracked.metrics.get(k)) is not None and math.isfinite(v)}
    # (a program's metrics file may hold NaN or infinity: such a point says nothing of its progress)
    return {
        "epoch": int(m.get("epoch", 0)),
        "epochs": spec["hyperparameters"]["epochs"],
        "samples_per_second": round(m["samples_per_second"], 1) if "samples_per_second" in m else None,
        "eta_seconds": round(m["eta_seconds"]) if "eta_seconds" in m else None,
    }


def _cost(config: ResourcesConfig, run: AirflowRun, spec: Mapping[str, Any], now: float) -> float:
    """What the run's GPUs cost so far: its finished tries, as the budget counts them, and the try that
    trains now, at its GPUs' price since it started."""
    from trainyard import paths
    from trainyard.scheduling.budgets import recorded_cost
    from trainyard.scheduling.resources import run_cost

    res = spec["resources"]
    done = recorded_cost(config, paths.run_path(spec["name"], run.key))
    slots = slot_type_of(res["gpu_type"], res.get("mig_profile"))
    if run.training_started is None or slots not in config.slot_types:
        return round(done, 2)
    gpus = res["nodes"] * res["gpus_per_node"]
    return round(done + run_cost(config, slots, max(now - run.training_started, 0.0) * gpus), 2)


def _links(run: AirflowRun, tracked: Tracked | None, registered: Mapping[str, Any] | None) -> dict[str, str]:
    """The run's page in Airflow; its MLflow run and curves; its model version (where those UIs are served:
    ``TRAINYARD_MLFLOW_URL``, ``TRAINYARD_TENSORBOARD_URL``, as the task's extra links)."""
    import os
    from urllib.parse import quote

    from trainyard.tracking import mlflow_tracking as mt

    links = {"run": f"/dags/{quote(run.dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"}
    mlflow = mt.ui_url()
    if tracked is not None and mlflow:
        links["mlflow"] = mt.run_page(mlflow, tracked.experiment_id, tracked.run_id)
    tensorboard = os.environ.get("TRAINYARD_TENSORBOARD_URL", "").rstrip("/")
    if tensorboard and tracked is not None:
        links["curves"] = tensorboard
    elif "mlflow" in links:
        links["curves"] = f"{links['mlflow']}/model-metrics"
    if registered and mlflow:
        links["model"] = mt.model_version_page(mlflow, registered["name"], registered["version"])
    return links


def job_rows(
    runs: Sequence[AirflowRun],
    reader: Acting,
    config: ResourcesConfig,
    ledger: Ledger | None,
    tracked: Mapping[str, Tracked],
    now: float | None = None,
) -> list[dict[str, Any]]:
    """The runs ``reader`` may see (:func:`visible_runs`), in their order, each as a row of the Jobs page: job, recipe,
    team, GPUs, state and stage, its place and reason while it waits, its progress while it trains, its cost
    so far, its result and its links. ``tracked``: each run's MLflow run by run key (:func:`tracked_runs`)."""
    from trainyard.scheduling.fleet_view import live_queue

    now = time.time() if now is None else now
    queue = live_queue(ledger, reader)
    waiting = {j["run"]: j for j in queue if j.get("run") and j["state"] == "waiting"}
    rows = []
    for run in visible_runs(runs, reader):
        spec = _spec(run)
        team = owner_team(run) or (spec["resources"]["team"] if spec else None)
        row: dict[str, Any] = {"run": run.key, "state": run.state, "stage": _stage(run), "note": run.note}
        if spec is None:
            rows.append(
                {
                    **row,
                    "job": (run.conf or {}).get("name"),
                    "result": "its spec was refused",
                    "links": _links(run, None, None),
                }
            )
            continue
        res = spec["resources"]
        queued = waiting.get(run.key)
        found = tracked.get(run.key)
        row.update(
            job=spec["name"],
            recipe=spec["recipe"],
            team=team,
            gpu_type=slot_type_of(res["gpu_type"], res.get("mig_profile")),  # a MIG job's: its slices'
            gpus=res["nodes"] * res["gpus_per_node"],
            place=queued["place"] if queued else None,
            reason=queued["reason"] if queued else None,
            starts_by=queued.get("starts_by") if queued else None,
            start=queued.get("start") if queued else None,
            progress=_progress(found, spec, run.tasks.get("train") == "running"),
            cost=_cost(config, run, spec, now),
            result=_result(run),
            links=_links(run, found, run.registered),
        )
        rows.append(row)
    return rows


def _result(run: AirflowRun) -> str | None:
    if run.registered:
        return f"model {run.registered['name']} version {run.registered['version']}"
    if run.state == "failed":
        failed = [t for t, s in run.tasks.items() if s == "failed"]
        return f"failed at {', '.join(failed)}" if failed else "failed"
    return None


def tracked_runs(client: Any, jobs: Mapping[str, Sequence[str]]) -> dict[str, Tracked]:
    """The MLflow runs of the runs ``jobs`` names (job name -> run keys), by run key: one search over the
    jobs' experiments, the newest runs first. Nothing for a job without an experiment yet."""
    from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG

    wanted = {key for keys in jobs.values() for key in keys}
    experiments = [e.experiment_id for name in jobs if (e := client.get_experiment_by_name(name)) is not None]
    if not experiments or not wanted:
        return {}
    found: dict[str, Tracked] = {}
    for r in client.search_runs(
        experiments, max_results=max(100, 4 * len(wanted)), order_by=["attributes.start_time DESC"]
    ):
        key = r.data.tags.get(RUN_KEY_TAG)
        if key in wanted and key not in found:
            found[key] = Tracked(r.info.run_id, r.info.experiment_id, dict(r.data.metrics))
    return found
