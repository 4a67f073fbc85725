"""The scheduler replay at a small size, under the real scheduler, api-server and triggerer: a stream of
jobs from four teams on the H100 pool (8 slots) of the shipped fleet, with one 4-slot job among 1- and
2-slot ones. Only invariants are asserted, never a utilisation figure (that is `make bench-scheduler`'s):
never more slots allocated than exist, no team above its quota plus its borrowing limit (both from
Airflow's own task records, through `trainyard report utilisation`), every job finishes, and the large
job starts within the wait bound."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIME_SCALE = 60  # scheduling.max_wait_minutes (30) becomes 30 s
MEDIAN_S = 8

pytestmark = pytest.mark.integration


def test_a_small_replay_keeps_every_limit_and_finishes_every_job(tmp_path):
    out = tmp_path / "replay.json"
    argv = [sys.executable, str(REPO / "bench" / "scheduler.py"), "--scenarios", "trainyard"]
    argv += ["--types", "h100-80gb", "--window", "40", "--median", str(MEDIAN_S), "--seed", "3"]
    argv += ["--time-scale", str(TIME_SCALE), "--drain-timeout", "600", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    figures = json.loads(out.read_text())
    (result,) = figures["results"]
    trace = figures["trace"]
    assert len(trace) >= 10 and any(j["slots"] >= 4 for j in trace), trace
    assert result["violations"] == [] and result["submit_errors"] == []
    assert result["runs"] == {"success": len(trace)}, result["runs"]
    # every job started: a wait was measured for each, and none is still waiting
    assert sum(w["jobs"] for w in result["waits"].values()) == len(trace)
    # the bound: the job that waited max_wait_minutes is passed by no one, so it starts once the jobs
    # running then end (each at most 8x the median long), plus the platform's own latency
    bound = 30 * 60 / TIME_SCALE + 8 * MEDIAN_S + 30
    large = result["large_job"]
    assert large["wait_s"] is not None and large["wait_s"] <= bound, large
    assert "h100-80gb" in result["pools"] and 0 < result["utilisation"] <= 1
    # the cost report reads the same run's usage records: every team that ran has GPU-hours
    assert "nlp" in result["cost_report"], result["cost_report"]
