"""The scheduler replay: does queueing with quotas and borrowing buy the utilisation it promises?

A multi-team job stream is submitted through the REST API to a real Airflow of this checkout
(api-server, scheduler, dag-processor, triggerer; ``bench/airflow_services.py``) against a virtual fleet:
the GPU pools of ``include/config/resources.yaml`` (``--types``, by default its V100, A100 and H100 pools),
no GPUs. Each job is a run of ``scheduler_replay`` (``bench/replay/``): the admission of
``train_pipeline`` (the same operator and ledger), then a stand-in that holds the job's pool slots for its
duration, deferred (``replay_standin.py``). The same trace runs twice, each time in a fresh Airflow:

* **static**: every team confined to its own quota (the file with every ``borrowing_limit`` 0): the world
  of per-team partitions, where an idle team's GPUs serve nobody;
* **trainyard**: the file as it is: quotas, borrowing and lending limits, priority, the wait bound.

The trace (``make_trace``, seeded): Poisson arrivals offering ``--load`` x the fleet's slots over
``--window`` seconds; job sizes mostly 1 slot with a tail of 2, 4 and 8 (``SIZES``: 70/15/10/5 %, the shape
of the published Philly and Helios cluster traces, where most jobs use one GPU and a few use 8 or more);
durations log-normal (median ``--median`` s, sigma 1: a heavy tail, capped at 8x the median); one team
busy at a time (``PHASES``: vision, then nlp, then research take 55 % of the jobs in turn), as teams'
deadlines come and go; each job on a GPU type where its team has quota enough to run it alone, so the
static world can run every job. One job of the largest size arrives early, into the stream of small ones.
Time is scaled: ``--time-scale`` trace seconds per second here (60: a second is a minute), which scales
``scheduling.max_wait_minutes``; the ledger is asked every
``--poll`` seconds.

Printed per scenario, from ``trainyard report utilisation`` over the submission window (utilisation) and
over the whole replay (waits, violations): utilisation (allocated slot-seconds / capacity), p50/p95 wait
by job size, the largest job's wait, GPU-seconds borrowed, slots over capacity or over quota + borrowing
limit (must be none), and the replay's makespan. Beside them, two columns computed in this process on the
same trace, with no latency: **simulated**, trainyard's own admission policy (``admission.policy.plan``), and the
**reference**, capacity alone (``capacity_reference``); every figure is also given as a ratio to the
reference. ``--png DIR`` keeps each scenario's chart; ``--out`` writes the figures as JSON.

    .venv/bin/python bench/scheduler.py [--window 480] [--load 1.25] [--median 40] [--seed 7]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import heapq
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import airflow_services
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "include"))
sys.path.insert(0, str(REPO / "bench" / "replay"))  # the stand-in's words for what it recorded

from trainyard.scheduling.admission.policy import (  # noqa: E402
    Entry,
    Job,
    PreemptionRules,
    Standing,
    plan,
)
from trainyard.scheduling.admission.starts import (  # noqa: E402
    HISTORY_READ,
    WAIT_FLOOR_S,
    History,
    StartEstimate,
    estimate_starts,
    wait_ratio,
)
from trainyard.scheduling.cluster import CPU_TYPE  # noqa: E402
from trainyard.scheduling.resources import ResourcesConfig, load_resources  # noqa: E402
from trainyard.scheduling.utilisation import SIZE_BUCKETS, Allocation  # noqa: E402
from trainyard.scheduling.utilisation import report as utilisation_report  # noqa: E402

DAG = "scheduler_replay"
SIZES = ((1, 0.70), (2, 0.15), (4, 0.10), (8, 0.05))
PHASES = ("vision", "nlp", "research")  # the busy team of each third of the window
BUSY_SHARE = 0.55
SIGMA = 1.0
PRIORITY = 100
# The Celery replay's GPU worker: every stand-in starts on it before it defers, and one started at a time (the
# profile's --concurrency 1, one CPU training at a time on 2 cores) queued the trace's starts behind each
# other; a GPU host's worker runs as many tasks as it has GPUs. As many as the LocalExecutor's parallelism
# here (replay_settings). Its cpu worker runs 4.
REPLAY_GPU_CONCURRENCY, REPLAY_CPU_CONCURRENCY = 8, 4
GOAL = 0.97  # of the capacity-only reference's utilisation over the submission window


@dataclass(frozen=True)
class TraceJob:
    name: str
    at: float  # seconds after the replay's start
    team: str
    gpu_type: str
    slots: int
    seconds: float
    max_hours: float | None = None  # its user's resources.max_hours (None: max_hours_of's default)


def _pick(rng: random.Random, weighted: list[tuple[object, float]]):
    total = sum(w for _, w in weighted)
    x = rng.random() * total
    for item, w in weighted:
        x -= w
        if x <= 0:
            return item
    return weighted[-1][0]


def _draw(rng: random.Random, config: ResourcesConfig, types: list[str], team: str, median: float):
    """A job of ``team``: a type weighted by its quota there, a size from SIZES that its quota holds."""
    size = _pick(rng, list(SIZES))
    fits = [(t, config.quota(team, t)) for t in types if config.quota(team, t) >= size]
    while not fits:  # no type where the team holds this size alone: the next smaller size
        size = max(s for s, _ in SIZES if s < size)
        fits = [(t, config.quota(team, t)) for t in types if config.quota(team, t) >= size]
    gpu_type = _pick(rng, fits)
    seconds = min(8 * median, max(0.1 * median, rng.lognormvariate(math.log(median), SIGMA)))
    return gpu_type, size, seconds


def make_trace(
    config: ResourcesConfig, types: list[str], *, window: float, load: float, median: float, seed: int
) -> list[TraceJob]:
    rng = random.Random(seed)
    teams = [t for t in config.teams if any(config.quota(t, g) for g in types)]
    capacity = sum(config.gpu_types[t].slots for t in types)

    def team_at(at: float) -> str:
        busy = PHASES[min(len(PHASES) - 1, int(at / window * len(PHASES)))]
        if busy not in teams:
            return rng.choice(teams)
        others = [t for t in teams if t != busy]
        return _pick(rng, [(busy, BUSY_SHARE)] + [(t, (1 - BUSY_SHARE) / len(others)) for t in others])

    probe = random.Random(seed + 1)  # the mean slot-seconds of a job, for the arrival rate
    mean = sum(s * d for _, s, d in (_draw(probe, config, types, probe.choice(teams), median) for _ in range(20000)))
    rate = load * capacity / (mean / 20000)
    jobs, at = [], 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= window:
            break
        team = team_at(at)
        gpu_type, slots, seconds = _draw(rng, config, types, team, median)
        jobs.append(TraceJob(f"j{len(jobs):04d}-{team}-{slots}", at, team, gpu_type, slots, seconds))
    # the large job: the largest size some team holds alone, a tenth into the window, among the small ones
    largest = max((config.quota(t, g), t, g) for t in teams for g in types)
    size = max(s for s, _ in SIZES if s <= largest[0])
    jobs.append(TraceJob(f"large-{largest[1]}-{size}", 0.1 * window, largest[1], largest[2], size, median * 2))
    return sorted(jobs, key=lambda j: j.at)


def scenario_config(base: ResourcesConfig, scenario: str, time_scale: float, poll: float) -> ResourcesConfig:
    data = base.model_dump(mode="json", exclude_unset=False)
    data["scheduling"]["max_wait_minutes"] = base.scheduling.max_wait_minutes / time_scale
    data["scheduling"]["admission_poll_seconds"] = poll
    # a preempted stand-in (bench/replay/replay_standin.py) stops within the grace, after the minimum runtime
    said = base.scheduling.preemption
    data["scheduling"]["preemption"]["min_runtime_minutes"] = said.min_runtime_minutes / time_scale
    data["scheduling"]["preemption"]["grace_seconds"] = said.grace_seconds / time_scale
    if scenario == "static":
        for team in data["teams"].values():
            team["borrowing_limit"] = dict.fromkeys(base.gpu_types, 0)
    return ResourcesConfig.model_validate(data)


def replay_settings(config_dir: Path, *, beside_the_pipelines: bool = False) -> dict[str, str]:
    """The environment that serves the replay's DAG under the fleet of ``config_dir``; with
    ``beside_the_pipelines`` as a second DAG bundle next to the dags folder's (one Airflow for both)."""
    replay_dags = REPO / "bench" / "replay"
    settings = {
        "TRAINYARD_CONFIG_DIR": str(config_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(replay_dags), os.environ.get("PYTHONPATH")])),
        "AIRFLOW__CORE__PARALLELISM": "8",
    }
    if beside_the_pipelines:  # after the rendered ones (scripts/render_airflow_cfg.py)
        # the pipelines' tasks start with the default preloaded libraries (the replay's need none of them)
        local = "airflow.dag_processing.bundles.local.LocalDagBundle"
        bundles = [{"name": "scheduler-replay", "classpath": local, "kwargs": {"path": str(replay_dags)}}]
        settings["TRAINYARD_EXTRA_DAG_BUNDLES"] = json.dumps(bundles)
    else:
        settings["AIRFLOW__CORE__DAGS_FOLDER"] = str(replay_dags)
        # what the replay's tasks import, instead of the pipelines' heavy libraries (a lighter scheduler)
        settings["AIRFLOW__TRAINYARD__PRELOAD_MODULES"] = "trainyard.scheduling.admission.lease"
    return settings


def write_config(config: ResourcesConfig, config_dir: Path) -> Path:
    """trainyard's config folder with ``config`` as its fleet."""
    shutil.copytree(REPO / "include" / "config", config_dir)
    (config_dir / "resources.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return config_dir


def one_host_with_every_type(config: ResourcesConfig) -> str:
    """The inventory (``TRAINYARD_GPU_DEVICES``) of one host with every GPU type of ``config``, each with a
    device per slot (the stand-ins claim none; a job is admitted only where one host has as many)."""
    return ";".join(
        f"{t}=" + ("" if t == CPU_TYPE else ",".join(f"{t}-{i}" for i in range(gpu.slots)))
        for t, gpu in config.slot_types.items()
    )


@contextlib.contextmanager
def fresh_airflow(config: ResourcesConfig, executor: str, workdir: Path):
    """A new Airflow that serves the replay under ``config``: ``local``, the LocalExecutor on its own
    PostgreSQL (under a job stream SQLite's single writer stops the scheduler or the triggerer with
    "database is locked", as Airflow's docs warn); ``celery``, the cluster profile (scripts/cluster.py:
    PostgreSQL, Redis, a Celery worker on the ``cpu`` queue and a GPU host's on every GPU type's, the ledger in
    PostgreSQL)."""
    settings = replay_settings(write_config(config, workdir / "config"))
    if executor == "celery":
        if str(REPO / "scripts") not in sys.path:
            sys.path.insert(0, str(REPO / "scripts"))
        import cluster as cluster_profile

        ports = {name: airflow_services._free_port() for name in cluster_profile.DEFAULT_PORTS}
        root = workdir / "cluster"
        root.mkdir(parents=True)
        root.chmod(0o755)  # PostgreSQL's own user reaches its folder through it
        workdir.chmod(0o755)
        workers = {
            "worker-cpu": cluster_profile.Worker(REPLAY_CPU_CONCURRENCY, queues="cpu"),
            "worker-gpu": cluster_profile.Worker(REPLAY_GPU_CONCURRENCY, gpus=one_host_with_every_type(config)),
        }
        cluster = cluster_profile.Cluster(root, ports, settings, workers)
        try:
            cluster.up(wait_s=600)
            yield airflow_services.OnCluster(cluster)
        finally:
            cluster.down(wait_s=10)
        return
    database = airflow_services.Postgres().start()
    af = airflow_services.Airflow(workdir / "airflow", workdir / "trainyard", database.url)
    af.env.update(settings)
    try:
        af.setup()
        af.start()
        yield af
    finally:
        af.stop()
        database.stop()


def run_trace(
    af, scenario: str, trace: list[TraceJob], types: list[str], *, window: float, drain_timeout: float,
    png: Path | None = None,
) -> dict:  # fmt: skip
    """Submit ``trace`` through ``af``'s REST API at its arrival times, wait for every run to end, and
    return the utilisation report's figures (``af``: a started ``airflow_services.Airflow`` that serves the
    replay's DAG)."""
    headers = af.headers()
    af.wait(lambda: requests.get(f"{af.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok, 300, DAG)
    before = _runs_by_state(af, headers)
    # a running platform is warm: one job through both tasks before the clock starts
    warm = af.trigger(DAG, {"resources": {"gpu_type": "cpu", "gpus_per_node": 1}, "hold_seconds": 0.1}, headers)
    assert af.wait_run(DAG, warm, headers, 300)["state"] == "success", af.failure_report(DAG, warm, headers)
    errors: list[str] = []
    t0 = time.time() + 2
    for job in trace:
        time.sleep(max(0.0, t0 + job.at - time.time()))
        conf = {
            "resources": {
                "team": job.team,
                "gpu_type": job.gpu_type,
                "nodes": 1,
                "gpus_per_node": job.slots,
                "priority": PRIORITY,
                "max_hours": max_hours_of(job),
            },
            "hold_seconds": round(job.seconds, 2),
            "restart_seconds": PREEMPTION_RESTART_S,
        }
        try:
            r = requests.post(
                f"{af.url}/api/v2/dags/{DAG}/dagRuns",
                headers=headers,
                json={"dag_run_id": job.name, "logical_date": None, "conf": conf},
                timeout=60,
            )
            r.raise_for_status()
        except requests.RequestException as err:
            errors.append(f"{job.name}: {err}")

    window_end = t0 + window
    states: dict[str, int] = {}

    def finished() -> bool:
        states.update(_runs_by_state(af, headers))
        ended = sum(states[s] - before[s] for s in ("success", "failed"))
        return ended >= len(trace) - len(errors) + 1

    af.wait(finished, drain_timeout, f"the {scenario} replay's runs to finish ({states})")
    end = time.time()
    # the counts are one request per state: a run that ended between two of them was counted both running
    # and ended (seen: {'running': 1, 'success': 17} for 17 jobs). Every run has ended now: read them again.
    states.update(_runs_by_state(af, headers))

    def utilisation(until: float, chart: Path | None = None) -> dict:
        since_iso = datetime.datetime.fromtimestamp(t0, datetime.UTC).isoformat()
        until_iso = datetime.datetime.fromtimestamp(until, datetime.UTC).isoformat()
        argv = ["trainyard", "report", "utilisation", "--json", "--since", since_iso, "--until", until_iso]
        argv += [a for t in types for a in ("--type", t)] + (["--png", str(chart)] if chart else [])
        out = subprocess.run(argv, env=af.env, check=True, capture_output=True, text=True, cwd=REPO).stdout
        return json.loads(out)

    in_window, whole = utilisation(window_end, png), utilisation(end)
    failures = {run_id: _why_failed(af, headers, run_id) for run_id in _failed_runs(af, headers)[:3]}
    runs = {s: states[s] - before[s] for s in states}
    runs["success"] -= 1  # the warm-up run
    cost = subprocess.run(
        ["trainyard", "report", "cost"], env=af.env, check=True, capture_output=True, text=True, cwd=REPO
    ).stdout
    large = next(j for j in trace if j.name.startswith("large-"))
    return {
        "scenario": scenario,
        "jobs": len(trace),
        "submit_errors": errors,
        "runs": {k: v for k, v in runs.items() if v},
        **_figures(in_window, whole),
        "large_job": {"run": large.name, "slots": large.slots, "wait_s": _wait_of(af, headers, large.name)},
        "violations": whole["violations"],
        "makespan_s": round(end - t0, 1),
        "cost_report": cost,
        "holds": held_slots(af.env, trace, t0, window, types, PREEMPTION_RESTART_S),
        "failures": failures,
    }


def _failed_runs(af, headers) -> list[str]:
    r = requests.get(
        f"{af.url}/api/v2/dags/{DAG}/dagRuns", headers=headers, params={"state": "failed", "limit": 100}, timeout=60
    )
    r.raise_for_status()
    return [run["dag_run_id"] for run in r.json()["dag_runs"]]


def _why_failed(af, headers, run_id: str) -> str:
    """A failed run's task states, its failed tasks' last log lines, and what the scheduler said of it (a
    task the executor reported after the scheduler had queued it again is failed there, not in its log)."""
    tis = af.task_instances(DAG, run_id, headers)
    lines = [json.dumps({t: (ti["state"], ti["try_number"]) for t, ti in tis.items()})]
    for ti in tis.values():
        if ti["state"] == "failed":
            try:
                lines.append(af.task_log(DAG, run_id, ti["task_id"], headers, ti["try_number"])[-1500:])
            except requests.RequestException as err:  # the replay's figures must not be lost for a log
                lines.append(f"(its log could not be fetched: {err})")
    for log in (af.home / "scheduler.log", getattr(getattr(af, "cluster", None), "logs", af.home) / "scheduler.log"):
        if log.is_file():
            lines += [line[:400] for line in log.read_text().splitlines() if run_id in line and "ailed" in line]
            break
    return "\n".join(lines)


def held_slots(
    env: dict, trace: list[TraceJob], t0: float, window: float, types: list[str], restart_s: float
) -> dict:  # fmt: skip
    """What the stand-ins' own usage records say of a replay that started at ``t0``, under its ``env`` (its
    TRAINYARD_HOME and config; a record per hold, so a job preempted k times has k + 1): utilisation over the
    window of the fleet's ``types``, preemptions, the GPU time lost to them (``restart_s`` a preemption, as
    :func:`preemption_simulation` counts it), and the p95 wait to the first hold of the jobs their team's
    quota had room for when they arrived (less the team's jobs holding slots of that type then): the
    lender's guarantee."""
    from replay_standin import PREEMPTED_WHERE

    from trainyard.spec import safe_key
    from trainyard.training.usage import tries

    config = load_resources(Path(env["TRAINYARD_CONFIG_DIR"]) / "resources.yaml")
    runs = Path(env["TRAINYARD_HOME"]) / "runs" / "replay"
    holds = {j.name: tries(runs / safe_key(f"{DAG}/{j.name}")) for j in trace}
    capacity = sum(config.gpu_types[t].slots for t in types)
    in_window = sum(
        j.slots * max(0.0, min(h["ended"], t0 + window) - max(h["started"], t0))
        for j in trace
        if j.gpu_type in types
        for h in holds[j.name]
    )
    by_name = {j.name: j for j in trace}

    def holding(team: str, gpu_type: str, at: float, name: str) -> int:
        """The slots of ``team``'s other jobs of ``gpu_type`` held at ``at``."""
        return sum(
            by_name[n].slots
            for n, hs in holds.items()
            if by_name[n].team == team and by_name[n].gpu_type == gpu_type
            for h in hs
            if h["started"] <= at < h["ended"] and n != name
        )

    quota_free = [
        min(h["started"] for h in holds[j.name]) - (t0 + j.at)
        for j in trace
        if holds[j.name]
        and holding(j.team, j.gpu_type, t0 + j.at, j.name) + j.slots <= config.quota(j.team, j.gpu_type)
    ]
    preemptions = {n: sum(h["where"] == PREEMPTED_WHERE for h in hs) for n, hs in holds.items()}
    work = sum(j.seconds * j.slots for j in trace)
    return {
        "utilisation": in_window / (capacity * window) if capacity and window else 0.0,
        "p95_wait_quota_free_s": round(p95(quota_free), 2) if quota_free else None,
        "preemptions": sum(preemptions.values()),
        "most_preemptions_of_a_job": max(preemptions.values(), default=0),
        "gpu_seconds_lost_share": sum(preemptions[j.name] * restart_s * j.slots for j in trace) / work,
        "unrecorded": sorted(n for n, hs in holds.items() if not hs),
    }


def _figures(in_window: dict, whole: dict) -> dict:
    """The table's figures from the utilisation report over the submission window and over the whole."""
    return {
        "utilisation": in_window["utilisation"],
        "utilisation_whole": whole["utilisation"],
        "pools": {p: v["utilisation"] for p, v in in_window["pools"].items()},
        "waits": whole["waits"],
        "longest_wait": whole["longest_wait"],
        "borrowed_gpu_s": whole["borrowed_gpu_s"],
    }


def _runs_by_state(af, headers) -> dict[str, int]:
    """How many runs of the replay's DAG are in each state (an Airflow may hold runs of an earlier replay)."""
    states = {}
    for state in ("queued", "running", "success", "failed"):
        r = requests.get(
            f"{af.url}/api/v2/dags/{DAG}/dagRuns", headers=headers, params={"state": state, "limit": 1}, timeout=30
        )
        r.raise_for_status()
        states[state] = r.json()["total_entries"]
    return states


def max_hours_of(job: TraceJob) -> float:
    """The job's ``resources.max_hours``: its user's (:func:`with_user_estimates`), else twice its duration,
    a user's estimate with room. The reservation of a job past the wait bound counts on it (every running
    job ends by then at the latest)."""
    return job.max_hours if job.max_hours is not None else round(max(0.01, 2 * job.seconds / 3600), 3)


# How far above its duration a user sets a job's max_hours, for the start estimates' calibration: drawn per
# job, log-uniform between 1.2x and 6x (a job stopped early, a user who leaves room, one who copies the last
# JobSpec's), so the share of its max_hours a job uses is not the same for all, as in life.
USER_ESTIMATE_SPREAD = (1.2, 6.0)


def with_user_estimates(trace: list[TraceJob], seed: int) -> list[TraceJob]:
    """``trace`` with each job's max_hours set as a user would: its duration times a factor drawn per job
    from :data:`USER_ESTIMATE_SPREAD` (seeded by the trace's seed and the job's name)."""
    lo, hi = (math.log(f) for f in USER_ESTIMATE_SPREAD)

    def user_max_hours(j: TraceJob) -> float:
        factor = math.exp(random.Random(f"{seed}/{j.name}").uniform(lo, hi))
        return round(max(0.001, j.seconds * factor / 3600), 4)

    return [dataclasses.replace(j, max_hours=user_max_hours(j)) for j in trace]


Starts = Callable[[float, list[TraceJob], list[tuple[TraceJob, float]]], list[TraceJob]]


def _simulate(
    scenario: str, config: ResourcesConfig, trace: list[TraceJob], types: list[str], window: float, starts: Starts
) -> dict:
    """The trace in this process, with no latency: whenever a job arrives or ends, ``starts(now, waiting,
    running)`` names the waiting jobs that start now (``running``: each job with its start)."""
    too_large = [j.name for j in trace if j.gpu_type not in types or j.slots > config.gpu_types[j.gpu_type].slots]
    if too_large:
        raise ValueError(f"jobs larger than their GPU type (or of a type not in {types}): {too_large}")
    arrivals = sorted(trace, key=lambda j: j.at)
    waiting: list[TraceJob] = []
    running: dict[str, tuple[TraceJob, float]] = {}
    ends: list[tuple[float, str]] = []  # a heap
    allocations: list[Allocation] = []
    i = 0
    while i < len(arrivals) or waiting:
        if ends and (i == len(arrivals) or ends[0][0] <= arrivals[i].at):
            now, name = heapq.heappop(ends)
            del running[name]
        elif i < len(arrivals):
            now = arrivals[i].at
            waiting.append(arrivals[i])
            i += 1
        else:
            raise RuntimeError(f"{scenario}: jobs that can never start: {[j.name for j in waiting]}")
        for job in starts(now, waiting, list(running.values())):
            waiting.remove(job)
            running[job.name] = (job, now)
            heapq.heappush(ends, (now + job.seconds, job.name))
            allocations.append(
                Allocation(job.name, job.team, job.gpu_type, job.slots, now, now + job.seconds, asked=job.at)
            )
    end = max(a.end for a in allocations if a.end is not None)
    in_window = utilisation_report(config, allocations, 0.0, window, types).as_dict()
    whole = utilisation_report(config, allocations, 0.0, end, types).as_dict()
    large = next(a for a in allocations if a.run.startswith("large-"))
    return {
        "scenario": scenario,
        "jobs": len(trace),
        "submit_errors": [],
        "runs": {"success": len(allocations)},
        **_figures(in_window, whole),
        "large_job": {"run": large.run, "slots": large.slots, "wait_s": round(large.start - large.asked, 1)},
        "violations": whole["violations"],
        "makespan_s": round(end, 1),
        "cost_report": "",
    }


def capacity_reference(config: ResourcesConfig, trace: list[TraceJob], types: list[str], window: float) -> dict:
    """The trace simulated in this process on capacity alone: no quota, no borrowing limit, no latency;
    whenever a job arrives or ends, the waiting jobs are looked at in arrival order and each that its type
    has room for starts (a small job passes a large one that does not fit). No queue that keeps teams'
    limits can beat its utilisation by much: the replay's figures are given as ratios to it."""

    def starts(now: float, waiting: list[TraceJob], running: list[tuple[TraceJob, float]]) -> list[TraceJob]:
        free = {t: config.gpu_types[t].slots for t in types}
        for job, _ in running:
            free[job.gpu_type] -= job.slots
        chosen = []
        for job in waiting:
            if free[job.gpu_type] >= job.slots:
                free[job.gpu_type] -= job.slots
                chosen.append(job)
        return chosen

    result = _simulate("reference", config, trace, types, window, starts)
    return {**result, "violations": []}  # it keeps no limit but capacity, so it has none to break


def admission_job(job: TraceJob) -> Job:
    """The ledger's view of a trace's job (what its run's ``resources`` would give)."""
    return Job(job.name, job.team, job.gpu_type, job.slots, PRIORITY, max_hours_of(job))


def _entries(waiting: list[TraceJob], running: list[tuple[TraceJob, float]]) -> list[Entry]:
    """The ledger's entries of a simulated moment: the waiting jobs, and the running ones with their starts
    (no lease runs out in a simulation)."""
    return [Entry(admission_job(j), j.at, None, 0, math.inf) for j in waiting] + [
        Entry(admission_job(j), j.at, started, 0, math.inf) for j, started in running
    ]


def policy_simulation(config: ResourcesConfig, trace: list[TraceJob], types: list[str], window: float) -> dict:
    """trainyard's admission policy on the trace in this process, with no latency: whenever a job arrives or
    ends, :func:`trainyard.scheduling.admission.policy.plan` (what the ledger applies) decides for every waiting
    job. ``config``: the scenario's (its wait bound scaled with the replay's time). Its distance from the
    reference is what the policy costs (quotas, borrowing and lending limits, the wait bound's
    reservation); its distance from the replayed trainyard column is what Airflow's latencies cost."""

    def starts(now: float, waiting: list[TraceJob], running: list[tuple[TraceJob, float]]) -> list[TraceJob]:
        entries = _entries(waiting, running)
        verdicts = plan(config, entries, now)
        return [j for j in waiting if verdicts[j.name].admitted]

    return _simulate("simulated", config, trace, types, window, starts)


# A preemption in trace seconds (time scale 60: a trace second is a minute): the victim's workers stop within
# the grace (30 s, half a trace second: a worst case, they stopped in 0.3 s in the executor's test), and once
# readmitted it spends 2 minutes starting again (its task, its processes, loading its checkpoint and data)
# before it trains: GPU time lost to the preemption. What it trained up to its stop is kept (its checkpoint).
PREEMPTION_STOP_S = 0.5
PREEMPTION_RESTART_S = 2.0


def p95(values: list[float]) -> float:
    """The 95th percentile of ``values`` (statistics' exclusive method); the one value, or 0 for none."""
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else (values[0] if values else 0.0)


def preemption_simulation(
    config: ResourcesConfig,
    trace: list[TraceJob],
    types: list[str],
    window: float,
    rules: PreemptionRules | None,
    *,
    stop_s: float = PREEMPTION_STOP_S,
    restart_s: float = PREEMPTION_RESTART_S,
) -> dict:
    """The policy on the trace in this process, with its preemption (``rules``; None: off), as the ledger
    applies it: a preempted job keeps its slots ``stop_s`` more, then waits again in its place (its arrival)
    with the work it had left plus ``restart_s`` (lost to the preemption). Figures: utilisation over the
    window, the p95 wait of the jobs admitted within their team's quota (no slot borrowed) and of all jobs
    (to their first start), preemptions, and the GPU-seconds lost to them against the trace's."""
    arrival = {j.name: j for j in trace}
    events: list[tuple[float, int, str, str]] = [(j.at, i, "arrive", j.name) for i, j in enumerate(trace)]
    heapq.heapify(events)
    seq = len(events)
    waiting: list[str] = []
    left = {j.name: j.seconds for j in trace}  # work left, seconds
    running: dict[str, tuple[float, int]] = {}  # started, slots borrowed
    ends: dict[str, float] = {}  # when a running job ends of itself (a preempted one's end is dropped)
    marks: dict[str, str] = {}  # victim -> the job it is preempted for
    counts = dict.fromkeys(left, 0)
    requeued: dict[str, float] = {}  # a preempted job's return to the queue
    first: dict[str, tuple[float, int]] = {}  # first start, slots borrowed then
    owed: set[str] = set()  # jobs that fit their team's quota, less what the team ran, when they arrived
    allocations: list[Allocation] = []

    def job(name: str) -> Job:
        return admission_job(arrival[name])

    def close(name: str, now: float) -> None:
        j, (started, _) = arrival[name], running.pop(name)
        allocations.append(
            Allocation(name, j.team, j.gpu_type, j.slots, started, now, asked=j.at, first_try=first[name][0] == started)
        )
        left[name] -= now - started

    while events:
        now, _, kind, name = heapq.heappop(events)
        if kind == "arrive":
            waiting.append(name)
            j = arrival[name]
            mine = sum(
                arrival[n].slots for n in running if arrival[n].team == j.team and arrival[n].gpu_type == j.gpu_type
            )
            if mine + j.slots <= config.quota(j.team, j.gpu_type):
                owed.add(name)
        elif kind == "end" and ends.get(name) == now and name not in marks:
            close(name, now)
        elif kind == "stopped":
            close(name, now)
            del marks[name], ends[name]
            left[name] += restart_s
            counts[name] += 1
            requeued[name] = now
            waiting.append(name)
        else:
            continue
        entries = [
            Entry(job(n), arrival[n].at, None, 0, math.inf, preemptions=counts[n], waiting_since=requeued.get(n, 0.0))
            for n in waiting
        ]
        entries += [
            Entry(
                job(n),
                arrival[n].at,
                started,
                borrowed,
                math.inf,
                preemptions=counts[n],
                preempted_for=marks.get(n, ""),
            )
            for n, (started, borrowed) in running.items()
        ]
        for n, verdict in plan(config, entries, now, preemption=rules).items():
            if verdict.admitted and n in waiting:
                waiting.remove(n)
                running[n] = (now, verdict.borrowed)
                first.setdefault(n, (now, verdict.borrowed))
                ends[n] = now + left[n]
                heapq.heappush(events, (ends[n], seq := seq + 1, "end", n))
            elif verdict.standing is Standing.PREEMPTED and n not in marks:
                marks[n] = verdict.preempted_for
                heapq.heappush(events, (now + stop_s, seq := seq + 1, "stopped", n))
    unfinished = [n for n, s in left.items() if s > 1e-6 or n in waiting]
    end = max(a.end for a in allocations if a.end is not None)
    in_window = utilisation_report(config, allocations, 0.0, window, types).as_dict()
    whole = utilisation_report(config, allocations, 0.0, end, types).as_dict()
    waits = {n: start - arrival[n].at for n, (start, _) in first.items()}
    within = [w for n, w in waits.items() if first[n][1] == 0]
    quota_owed = [w for n, w in waits.items() if n in owed]
    lost = sum(counts[n] * restart_s * arrival[n].slots for n in counts)
    work = sum(j.seconds * j.slots for j in trace)

    return {
        "utilisation": in_window["utilisation"],
        "p95_wait_within_quota_s": round(p95(within), 2),
        # the lender's guarantee: jobs its quota had room for (less its own running jobs) when they arrived
        "p95_wait_quota_free_s": round(p95(quota_owed), 2),
        "p95_wait_s": round(p95(list(waits.values())), 2),
        "preemptions": sum(counts.values()),
        "most_preemptions_of_a_job": max(counts.values()),
        "gpu_seconds_lost_share": lost / work,
        "violations": len(whole["violations"]),
        "unfinished": len(unfinished),
    }


def preemption_on_traces(
    base: ResourcesConfig, types: list[str], *, seeds: list[int], loads: list[float], window: float, median: float,
    time_scale: float, poll: float,
) -> list[dict]:  # fmt: skip
    """:func:`preemption_simulation` without and with the preemption of resources.yaml (its minimum runtime
    scaled with the trace's time) against the capacity-only reference, on a trace per seed and load."""
    config = scenario_config(base, "trainyard", time_scale, poll)
    said = config.scheduling.preemption
    rules = PreemptionRules(said.min_runtime_minutes * 60, said.max_preemptions)  # "on" where the file has it off
    rows = []
    for seed in seeds:
        for load in loads:
            trace = make_trace(base, types, window=window, load=load, median=median, seed=seed)
            reference = capacity_reference(base, trace, types, window)["utilisation"]
            for label, with_rules in (("off", None), ("on", rules)):
                figures = preemption_simulation(config, trace, types, window, with_rules)
                ratio = figures["utilisation"] / reference if reference else 1.0
                rows.append(
                    {"seed": seed, "load": load, "jobs": len(trace), "preemption": label, "ratio": ratio, **figures}
                )
    return rows


def start_estimates(
    config: ResourcesConfig, trace: list[TraceJob], types: list[str], window: float, floor_s: float
) -> list[dict]:
    """How the start a waiting job is told as it first waits
    (:func:`~trainyard.scheduling.admission.starts.estimate_starts`: the expected start and its band from how
    long the jobs finished so far held their slots, the latest from the max_hours) compares with when it
    started, with the policy alone on the trace (:func:`policy_simulation`'s decisions): per job that waited,
    the waits it was told (None: none) and its real wait. ``floor_s``: the ratios' floor in trace seconds
    (:data:`~trainyard.scheduling.admission.starts.WAIT_FLOOR_S`, a look, scaled)."""

    told: dict[str, tuple[float, StartEstimate | None]] = {}  # job -> when it was told, and what
    started: dict[str, float] = {}
    finished: list[tuple[str, float]] = []  # (team, share of its max_hours it held its slots)
    ratios: list[float] = []  # how the waits of jobs that started came out against what they were told
    was_running: dict[str, TraceJob] = {}

    def starts(now: float, waiting: list[TraceJob], running: list[tuple[TraceJob, float]]) -> list[TraceJob]:
        names = {j.name for j, _ in running}
        finished.extend(
            (j.team, j.seconds / (max_hours_of(j) * 3600)) for n, j in was_running.items() if n not in names
        )
        was_running.clear()
        was_running.update({j.name: j for j, _ in running})
        entries = _entries(waiting, running)
        verdicts = plan(config, entries, now)
        chosen = [j for j in waiting if verdicts[j.name].admitted]
        new = [j for j in waiting if j.name not in told and j not in chosen]
        if new:
            history = History.of(finished[-HISTORY_READ:], ratios[-HISTORY_READ:])
            found = estimate_starts(config, entries, now, history=history, floor_s=floor_s)
            told.update({j.name: (now, found.get(j.name)) for j in new})
        for j in chosen:  # as the ledger records it at an admission (Ledger.told)
            at, est = told.get(j.name, (now, None))
            if est is not None and est.expected is not None:
                ratios.append(wait_ratio(est.expected - at, now - at, floor_s))
        started.update({j.name: now for j in chosen})
        return chosen

    _simulate("estimates", config, trace, types, window, starts)

    def wait(at: float, t: float | None) -> float | None:
        return None if t is None else t - at

    rows = []
    for name, (at, est) in told.items():
        arrived = next(j.at for j in trace if j.name == name)
        rows.append(
            {
                "job": name,
                "wait_s": started[name] - arrived,
                "told_after_s": at - arrived,
                "bound_s": wait(arrived, est.latest if est else None),
                "expected_s": wait(arrived, est.expected if est else None),
                "early_s": wait(arrived, est.early if est else None),
                "late_s": wait(arrived, est.late if est else None),
            }
        )
    return rows


def start_estimates_on_traces(
    base: ResourcesConfig, types: list[str], *, seeds: list[int], loads: list[float], window: float, median: float,
    time_scale: float, poll: float,
) -> dict:  # fmt: skip
    """:func:`start_estimates` over a trace per seed and load, each job's max_hours set as a user would
    (:func:`with_user_estimates`): the issue's calibration figures, the median of |expected wait - real
    wait| / real wait and the share of starts inside the band, and the share that started by the bound."""
    config = scenario_config(base, "trainyard", time_scale, poll)
    rows = []
    for seed in seeds:
        for load in loads:
            trace = make_trace(base, types, window=window, load=load, median=median, seed=seed)
            rows += start_estimates(config, with_user_estimates(trace, seed), types, window, WAIT_FLOOR_S / time_scale)
    bounded = [r for r in rows if r["bound_s"] is not None]
    estimated = [r for r in rows if r["expected_s"] is not None]
    banded = [r for r in estimated if r["early_s"] is not None]

    def relative(r: dict, key: str) -> float:
        return abs(r[key] - r["wait_s"]) / max(r["wait_s"], 1.0)

    def share(rows: list[dict], test: Callable[[dict], bool]) -> float:
        return sum(map(test, rows)) / len(rows) if rows else 0.0

    return {
        "jobs_that_waited": len(rows),
        "with_a_bound": len(bounded),
        "started_by_their_bound": share(bounded, lambda r: r["wait_s"] <= r["bound_s"] + 1e-6),
        "bound_median_relative_error": statistics.median(relative(r, "bound_s") for r in bounded) if bounded else 0,
        "with_an_estimate": len(estimated),
        "estimate_median_relative_error": statistics.median(relative(r, "expected_s") for r in estimated)
        if estimated
        else 0,
        "with_a_band": len(banded),
        "started_inside_the_band": share(banded, lambda r: r["early_s"] - 1e-6 <= r["wait_s"] <= r["late_s"] + 1e-6),
        "median_real_wait_s": statistics.median(r["wait_s"] for r in estimated) if estimated else 0,
    }


def policy_on_traces(
    base: ResourcesConfig,
    types: list[str],
    *,
    seeds: list[int],
    loads: list[float],
    window: float,
    median: float,
    time_scale: float,
    poll: float,
) -> list[dict]:
    """The policy alone (:func:`policy_simulation`) against the reference on many traces, one per seed and
    load: no Airflow, a fraction of a second each. Each row: seed, load, jobs, both utilisations, their
    ratio (1 where the reference used nothing), the policy's violations and the jobs it left unfinished."""
    config = scenario_config(base, "trainyard", time_scale, poll)
    rows = []
    for seed in seeds:
        for load in loads:
            trace = make_trace(base, types, window=window, load=load, median=median, seed=seed)
            policy = policy_simulation(config, trace, types, window)
            reference = capacity_reference(base, trace, types, window)
            rows.append(
                {
                    "seed": seed,
                    "load": load,
                    "jobs": len(trace),
                    "policy": policy["utilisation"],
                    "reference": reference["utilisation"],
                    "ratio": policy["utilisation"] / reference["utilisation"] if reference["utilisation"] else 1.0,
                    "violations": len(policy["violations"]),
                    "unfinished": len(trace) - policy["runs"].get("success", 0),
                }
            )
    return rows


def _wait_of(af, headers, run_id: str) -> float | None:
    r = requests.get(f"{af.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances", headers=headers, timeout=30)
    if not r.ok:
        raise RuntimeError(f"task instances of {run_id}: HTTP {r.status_code}: {r.text[:500]}")
    tis = {ti["task_id"]: ti for ti in r.json()["task_instances"]}
    admit, train = tis.get("admit", {}), tis.get("train", {})
    if not admit.get("start_date") or not train.get("start_date"):
        return None
    start = datetime.datetime.fromisoformat
    return round((start(train["start_date"]) - start(admit["start_date"])).total_seconds(), 1)


def table(results: list[dict]) -> str:
    names = [r["scenario"] for r in results]
    rows = [("", *names), ("jobs", *(str(r["jobs"]) for r in results))]
    rows.append(("utilisation (submission window)", *(f"{r['utilisation']:.1%}" for r in results)))
    rows.append(("utilisation (until the last job ended)", *(f"{r['utilisation_whole']:.1%}" for r in results)))
    pools = sorted({p for r in results for p in r["pools"]})
    for p in pools:
        rows.append((f"  gpu-{p}", *(f"{r['pools'].get(p, 0):.1%}" for r in results)))
    buckets = [b for _, _, b in SIZE_BUCKETS if any(b in r["waits"] for r in results)]
    for b in buckets:
        rows.append(
            (
                f"wait p50 / p95, {b}-slot jobs (s)",
                *(
                    f"{r['waits'][b]['p50_s']:.1f} / {r['waits'][b]['p95_s']:.1f}" if b in r["waits"] else "-"
                    for r in results
                ),
            )
        )
    rows.append(
        (
            "the large job's wait (s)",
            *(f"{r['large_job']['wait_s']} ({r['large_job']['slots']} slots)" for r in results),
        )
    )
    rows.append(("longest wait (s)", *(f"{(r['longest_wait'] or {}).get('seconds', 0):.1f}" for r in results)))
    rows.append(("borrowed GPU-s", *(f"{r['borrowed_gpu_s']:.0f}" for r in results)))
    rows.append(("violations", *(str(len(r["violations"])) for r in results)))
    rows.append(("makespan (s)", *(f"{r['makespan_s']:.0f}" for r in results)))
    rows.append(("runs", *(json.dumps(r["runs"]) for r in results)))
    reference = next((r for r in results if r["scenario"] == "reference"), None)
    if reference is not None:

        def ratio(value: float | None, limit: float | None) -> str:
            return f"{value / limit:.2f}x" if value is not None and limit else "-"

        rows.append(("as a ratio to the reference:", *("" for _ in results)))
        rows.append(("  utilisation (submission window)",
                     *(ratio(r["utilisation"], reference["utilisation"]) for r in results)))  # fmt: skip
        rows.append(("  utilisation (until the last job ended)",
                     *(ratio(r["utilisation_whole"], reference["utilisation_whole"]) for r in results)))  # fmt: skip
        rows.append(("  makespan", *(ratio(r["makespan_s"], reference["makespan_s"]) for r in results)))
        for b in buckets:
            limit = reference["waits"].get(b, {}).get("p95_s")
            rows.append((f"  wait p95, {b}-slot jobs",
                         *(ratio(r["waits"].get(b, {}).get("p95_s"), limit) for r in results)))  # fmt: skip
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:{width}s}  " + "  ".join(f"{c:>22s}" for c in r[1:]) for r in rows)


def _holds_line(scenario: str, h: dict) -> str:
    """One line of a replay's preemption figures (:func:`held_slots`, or :func:`preemption_simulation`'s)."""
    wait = h["p95_wait_quota_free_s"]
    return (
        f"{scenario}: utilisation {h['utilisation']:.1%} (by the holds), preemptions {h['preemptions']} (at most "
        f"{h['most_preemptions_of_a_job']} a job), GPU-s lost {h['gpu_seconds_lost_share']:.2%}, p95 wait of jobs "
        f"their quota had room for {'-' if wait is None else f'{wait:.1f} s'}"
    )


def against_the_goal(results: list[dict]) -> list[str]:
    """trainyard's utilisation over the submission window against GOAL x the reference's (static
    partitions are there to show what queueing buys, not to meet it), and the policy's alone."""
    reference = next(r for r in results if r["scenario"] == "reference")
    lines = []
    for r in results:
        x = r["utilisation"] / reference["utilisation"]
        if r["scenario"] == "trainyard":
            verdict = "met" if x >= GOAL else "missed"
            lines.append(f"{r['scenario']}: {x:.2f}x the reference's utilisation (goal {GOAL}x: {verdict})")
        if r["scenario"] == "simulated":
            lines.append(f"simulated: trainyard's policy alone, no latency, {x:.2f}x the reference's utilisation")
    return lines


def _replay_options(args: argparse.Namespace) -> dict:
    """The command line's choice of traces and replay settings, as the policy-only replays take them."""
    return {"seeds": args.policy_only, "loads": args.loads, "window": args.window, "median": args.median,
            "time_scale": args.time_scale, "poll": args.poll}  # fmt: skip


def _print_preemption(base: ResourcesConfig, args: argparse.Namespace) -> int:
    rows = preemption_on_traces(base, args.types, **_replay_options(args))
    for r in rows:
        print(
            f"seed {r['seed']:3d} load {r['load']:<5g} jobs {r['jobs']:4d} preemption {r['preemption']:3s}: "
            f"{r['ratio']:.3f}x the reference, p95 wait with quota free {r['p95_wait_quota_free_s']:6.1f} s, "
            f"within quota {r['p95_wait_within_quota_s']:7.1f} s, "
            f"all {r['p95_wait_s']:7.1f} s, preemptions {r['preemptions']:3d} "
            f"(at most {r['most_preemptions_of_a_job']} a job), GPU-s lost {r['gpu_seconds_lost_share']:.2%}, "
            f"violations {r['violations']}, unfinished {r['unfinished']}"
        )
    for label in ("off", "on"):
        mine = [r for r in rows if r["preemption"] == label]
        print(
            f"preemption {label}: {len(mine)} traces, utilisation {min(r['ratio'] for r in mine):.3f}x the reference "
            f"at worst (median {statistics.median(r['ratio'] for r in mine):.3f}x), p95 wait of jobs their quota "
            f"had room for median {statistics.median(r['p95_wait_quota_free_s'] for r in mine):.1f} s (worst "
            f"{max(r['p95_wait_quota_free_s'] for r in mine):.1f} s), p95 wait within quota median "
            f"{statistics.median(r['p95_wait_within_quota_s'] for r in mine):.1f} s, GPU-s lost at most "
            f"{max(r['gpu_seconds_lost_share'] for r in mine):.2%}"
        )
    return 1 if any(r["violations"] or r["unfinished"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=480, help="seconds of submissions")
    parser.add_argument("--load", type=float, default=1.25, help="offered slot-seconds / the fleet's, per second")
    parser.add_argument("--median", type=float, default=40, help="median job duration, seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--types", nargs="+", default=["v100-16gb", "a100-80gb", "h100-80gb"])
    parser.add_argument("--scenarios", nargs="+", default=["static", "trainyard"], choices=["static", "trainyard"])
    parser.add_argument(
        "--executor",
        choices=["local", "celery"],
        default="local",
        help="local: the LocalExecutor on PostgreSQL; celery: the cluster profile (workers on cpu and gpu)",
    )
    parser.add_argument("--time-scale", type=float, default=60, help="trace seconds per second of the replay")
    parser.add_argument("--poll", type=float, default=1.0, help="scheduling.admission_poll_seconds")
    parser.add_argument("--drain-timeout", type=float, default=1800, help="seconds to wait for the last runs")
    parser.add_argument("--resources", help="the fleet (default: include/config/resources.yaml)")
    parser.add_argument("--png", help="a folder for each scenario's utilisation chart")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument(
        "--policy-only",
        nargs="+",
        type=int,
        metavar="SEED",
        help="no Airflow: the policy alone against the reference on a trace per seed and each of --loads",
    )
    parser.add_argument("--loads", nargs="+", type=float, default=[1.0, 1.25, 1.5], help="with --policy-only")
    parser.add_argument(
        "--start-estimates",
        action="store_true",
        help="with --policy-only: how each waiting job's expected and latest start compare with its start, instead",
    )
    parser.add_argument(
        "--preemption",
        action="store_true",
        help="with --policy-only: the policy without and with preemption, per trace, instead",
    )
    args = parser.parse_args(argv)
    base = load_resources(args.resources)
    if args.policy_only and args.preemption:
        return _print_preemption(base, args)
    if args.policy_only and args.start_estimates:
        figures = start_estimates_on_traces(base, args.types, **_replay_options(args))
        print(json.dumps(figures, indent=1))
        return 0
    if args.policy_only:
        rows = policy_on_traces(base, args.types, **_replay_options(args))
        for r in rows:
            print(
                f"seed {r['seed']:3d} load {r['load']:<5g} jobs {r['jobs']:4d}: policy {r['policy']:.1%}, reference "
                f"{r['reference']:.1%}, {r['ratio']:.3f}x, violations {r['violations']}, unfinished {r['unfinished']}"
            )
        ratios = sorted(r["ratio"] for r in rows)
        print(
            f"{len(rows)} traces: the policy alone {ratios[0]:.3f}x the reference's utilisation at worst, median "
            f"{statistics.median(ratios):.3f}x (goal {GOAL}x: {'met' if ratios[0] >= GOAL else 'missed'}); "
            f"violations {sum(r['violations'] for r in rows)}"
        )
        return 1 if ratios[0] < GOAL or any(r["violations"] or r["unfinished"] for r in rows) else 0
    trace = make_trace(base, args.types, window=args.window, load=args.load, median=args.median, seed=args.seed)
    sizes = {s: sum(1 for j in trace if j.slots == s) for s, _ in SIZES}
    print(
        f"trace: {len(trace)} jobs over {args.window:.0f} s (sizes {sizes}), offered load {args.load}, median "
        f"{args.median:.0f} s, on {', '.join(args.types)} ({sum(base.gpu_types[t].slots for t in args.types)} "
        f"slots); time scale {args.time_scale:g}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="trainyard-replay-") as tmp:
        Path(tmp).chmod(0o755)  # the cluster's PostgreSQL runs as its own user
        for scenario in args.scenarios:
            config = scenario_config(base, scenario, args.time_scale, args.poll)
            started = time.time()
            with fresh_airflow(config, args.executor, Path(tmp) / scenario) as af:
                png = Path(args.png) / f"utilisation-{scenario}.png" if args.png else None
                figures = run_trace(af, scenario, trace, args.types, window=args.window,
                                    drain_timeout=args.drain_timeout, png=png)  # fmt: skip
            results.append(figures)
            print(f"{scenario}: replayed in {time.time() - started:.0f} s", flush=True)
            print(_holds_line(scenario, figures["holds"]), flush=True)
    simulated = scenario_config(base, "trainyard", args.time_scale, args.poll)
    rules = PreemptionRules.of(simulated)
    if rules is not None:  # the same trace through the policy alone, preempting as the ledger does
        alone = preemption_simulation(simulated, trace, args.types, args.window, rules)
        print(_holds_line("simulated, preempting", alone), flush=True)
    results.append(policy_simulation(simulated, trace, args.types, args.window))
    results.append(capacity_reference(base, trace, args.types, args.window))
    print(table(results))
    print("\n".join(against_the_goal(results)))
    for r in results:
        for v in r["violations"]:
            print(f"VIOLATION ({r['scenario']}): {v}")
        for run_id, why in r.get("failures", {}).items():
            print(f"FAILED ({r['scenario']}): {run_id}\n{why}")
    if args.out:
        Path(args.out).write_text(json.dumps({"trace": [asdict(j) for j in trace], "results": results}, indent=1))
    return 1 if any(r["violations"] or r["submit_errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
