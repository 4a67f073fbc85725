"""Orchestration: what Airflow adds to a pipeline, under the real scheduler.

A real Airflow of this checkout (api-server, scheduler, dag-processor; LocalExecutor; ``bench/airflow_services.py``)
runs ``train_pipeline`` with the digits job (``--conf``, by default the JobSpec defaults with 1 process and
3 epochs), triggered through the REST API ``--runs`` times. Alternating with those, the same steps are
called as plain Python in one fresh process (``pipeline.validate_spec`` ... ``pipeline.register``, what
the tasks call), each side with its own TRAINYARD_HOME, so the first run of each pays ingestion and
preparation and the others find them cached.

Printed: the pipeline's wall time on both sides (first run, and the median of the others) and their ratio
(the goal is at most 1.3x); the gap between tasks under the scheduler (a task's start minus the end of the
last of its upstream tasks: median and p95 over every task of every run); and each task's median duration
against the same step in process, which shows what a task re-does (imports, set-up).

    .venv/bin/python bench/orchestration.py [--runs 3] [--conf '{...}']
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import airflow_services
from child_process import child_result

DAG = "train_pipeline.default"  # team default's own (multi-team mode)
CONF = {"hyperparameters": {"epochs": 3}, "resources": {"gpus_per_node": 1}}
STEPS = (
    "validate_spec",
    "resolve_dataset",
    "validate_data",
    "prepare_data",
    "admit",
    "train",
    "evaluate",
    "gate",
    "export_onnx",
    "register",
)


def in_process(conf: dict) -> None:
    """The DAG's steps as plain calls, timed; prints JSON {step: seconds, "wall": seconds}."""
    t0 = time.perf_counter()
    times = {}

    def timed(name, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        times[name] = time.perf_counter() - start
        return out

    from trainyard import pipeline
    from trainyard.form import spec_input

    key = f"bench/{os.getpid()}"
    spec = timed("validate_spec", pipeline.validate_spec, spec_input(conf))
    dataset = timed("resolve_dataset", pipeline.resolve_dataset, spec)
    timed("validate_data", pipeline.validate_data, spec, dataset, key)
    data = timed("prepare_data", pipeline.prepare_data, spec, dataset)
    from trainyard.scheduling.admission.lease import hold
    from trainyard.scheduling.admission.ledger import default_ledger, job_for

    ledger, job = default_ledger(), job_for(spec.resources, key)
    assert timed("admit", ledger.request, job).admitted
    with hold(ledger, job):
        trained = timed("train", pipeline.train, spec, dataset, data, key)
    metrics = timed("evaluate", pipeline.evaluate, spec, trained, data)
    verdict = timed("gate", pipeline.gate, spec, metrics, data, trained)
    assert verdict["passed"], verdict
    exported = timed("export_onnx", pipeline.export_onnx, spec, trained, data)
    timed("register", pipeline.register, spec, dataset, trained, exported, metrics, key)
    times["wall"] = time.perf_counter() - t0
    print(json.dumps(times))


def _ts(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def scheduled_run(
    af, conf: dict, headers: dict, upstream: dict[str, list[str]]
) -> tuple[str, float, dict, list[float]]:
    """(run id, wall seconds, {task: duration}, gaps) of one run triggered through the REST API."""
    run_id = af.trigger(DAG, conf, headers)
    run = af.wait_run(DAG, run_id, headers)
    tis = af.task_instances(DAG, run_id, headers)
    if run["state"] != "success":
        states = {t: ti["state"] for t, ti in tis.items()}  # last: what is kept of a long report is its end
        raise SystemExit(f"{af.failure_report(DAG, run_id, headers)}\nrun {run_id} ended {run['state']}: {states}")
    ran = {t: ti for t, ti in tis.items() if ti["state"] == "success"}
    ends = {t: _ts(ti["end_date"]) for t, ti in tis.items() if ti.get("end_date")}
    gaps = []
    for task, ti in ran.items():
        before = [ends[u] for u in upstream.get(task, []) if u in ends]
        ready = max(before) if before else _ts(run["queued_at"] or run["start_date"])
        gaps.append(_ts(ti["start_date"]) - ready)
    wall = _ts(run["end_date"]) - _ts(run["start_date"])
    return run_id, wall, {t: ti["duration"] for t, ti in ran.items()}, gaps


def measure(af, conf: dict, runs: int, plain_home: Path) -> tuple[list[str], list[str]]:
    """Both sides ``runs`` times, in turns, against the started Airflow ``af`` (its DAG parsed), the plain
    side with ``plain_home`` as its TRAINYARD_HOME: (the report's lines, the scheduled runs' ids)."""
    import requests

    headers = af.headers()
    tasks = requests.get(f"{af.url}/api/v2/dags/{DAG}/tasks", headers=headers, timeout=10).json()["tasks"]
    upstream: dict[str, list[str]] = {}
    for t in tasks:
        for d in t["downstream_task_ids"]:
            upstream.setdefault(d, []).append(t["task_id"])
    env = {**os.environ, "TRAINYARD_HOME": str(plain_home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    keygen = [sys.executable, "-m", "trainyard.cli", "models", "keygen", "--if-missing"]
    subprocess.run(keygen, env=env, check=True, capture_output=True)  # register signs, as in Airflow
    plain, sched, durations, gaps, run_ids = [], [], [], [], []
    for _ in range(runs):
        plain.append(child_result([__file__, "--in-process", json.dumps(conf)], env))
        run_id, wall, took, run_gaps = scheduled_run(af, conf, headers, upstream)
        run_ids.append(run_id)
        sched.append(wall)
        durations.append(took)
        gaps += run_gaps
    later = slice(1, None) if runs > 1 else slice(0, None)
    p_first, s_first = plain[0]["wall"], sched[0]
    p_rest = statistics.median(r["wall"] for r in plain[later])
    s_rest = statistics.median(sched[later])
    gaps.sort()
    p95 = gaps[min(len(gaps) - 1, round(0.95 * (len(gaps) - 1)))]
    lines = [
        "  (in process: a fresh process, its imports included; Airflow: the scheduler preloaded them at start)",
        f"  pipeline wall: first run  in process {p_first:6.1f} s  under Airflow {s_first:6.1f} s  "
        f"ratio {s_first / p_first:.2f}x",
        f"  pipeline wall: later runs in process {p_rest:6.1f} s  under Airflow {s_rest:6.1f} s  "
        f"ratio {s_rest / p_rest:.2f}x (median)",
        f"  gap between tasks: median {statistics.median(gaps):.2f} s, p95 {p95:.2f} s ({len(gaps)} tasks)",
        f"  {'step':16} {'task (median)':>14} {'in process':>11}",
    ]
    for step in STEPS:
        task = statistics.median(d[step] for d in durations[later] if step in d)
        alone = statistics.median(r[step] for r in plain[later])
        lines.append(f"  {step:16} {task:>12.2f} s {alone:>9.2f} s")
    return lines, run_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conf", type=json.loads, default=CONF, help="the JobSpec conf of every run (JSON)")
    parser.add_argument("--in-process", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process is not None:
        in_process(args.in_process)
        return
    import requests

    with tempfile.TemporaryDirectory(prefix="trainyard-bench-orch-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "airflow").mkdir()
        af = airflow_services.Airflow(tmp_path / "airflow", tmp_path / "home-airflow")
        af.setup()
        t0 = time.perf_counter()
        af.start()
        started = time.perf_counter() - t0
        try:
            headers = af.headers()
            af.wait(lambda: requests.get(f"{af.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok, 600, "parse")
            lines, _ = measure(af, args.conf, args.runs, tmp_path / "home-plain")
        finally:
            af.stop()
    print(
        f"train_pipeline, conf {json.dumps(args.conf)}, {args.runs} runs a side (Airflow started in {started:.0f} s):"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
