"""The scheduler replay at a small size, under the real scheduler, api-server and triggerer: a stream of
jobs from two teams on an 8-slot pool where every limit binds (``tests/fixtures/replay_fleet.yaml``: vision
borrows at most 2, nlp lends at most 2), with one 4-slot job among 1- and 2-slot ones. Only invariants are
asserted, never a utilisation figure (that is `make bench-scheduler`'s): from Airflow's own task records,
through `trainyard report utilisation`, never more slots allocated than exist, no team above its quota
plus its borrowing limit (for more than a handover's moment); borrowing happened; every job
finishes; the large job starts within the wait bound; the cost report has the run's GPU time."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.scheduling.resources import load_resources

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "tests" / "fixtures" / "replay_fleet.yaml"
TIME_SCALE = 60
MEDIAN_S = 8

pytestmark = pytest.mark.integration


def test_a_small_replay_keeps_every_limit_and_finishes_every_job(tmp_path):
    out = tmp_path / "replay.json"
    argv = [sys.executable, str(REPO / "bench" / "scheduler.py"), "--scenarios", "trainyard"]
    argv += ["--resources", str(FLEET), "--types", "h100-80gb", "--window", "40", "--median", str(MEDIAN_S)]
    argv += ["--seed", "3", "--time-scale", str(TIME_SCALE), "--drain-timeout", "600", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    figures = json.loads(out.read_text())
    (result,) = figures["results"]
    trace = figures["trace"]
    assert len(trace) >= 10, trace
    assert result["violations"] == [] and result["submit_errors"] == []
    assert result["runs"] == {"success": len(trace)}, result["runs"]
    # every job started: a wait was measured for each, and none is still waiting
    assert sum(w["jobs"] for w in result["waits"].values()) == len(trace)
    assert result["borrowed_gpu_s"] > 0  # the limits were exercised, not idle
    # the bound: a job that waited max_wait_minutes is passed by no one of its team and by no borrower,
    # so it starts once enough running jobs end (each at most 8x the median), plus the platform's latency
    max_wait_s = load_resources(FLEET).scheduling.max_wait_minutes * 60 / TIME_SCALE
    large = result["large_job"]
    assert large["slots"] == 4 and large["wait_s"] is not None, large
    assert large["wait_s"] <= max_wait_s + 8 * MEDIAN_S + 30, large
    # the cost report reads the same run's usage records: both teams have GPU-hours
    hours = {line.split()[0]: float(line.split()[4]) for line in result["cost_report"].splitlines()[1:]}
    assert hours["vision"] > 0 and hours["nlp"] > 0, result["cost_report"]
