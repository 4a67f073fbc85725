"""The admission ledger at the scale of a company's queue: 1,000 and 10,000 jobs waiting on PostgreSQL.

The replays (``bench/scheduler.py``) hold 100 to 350 jobs; a company's queue holds thousands. Per queue
length, on a throwaway PostgreSQL server (the cluster profile's ledger) and the fleet of
``include/config/resources.yaml``:

* **the policy alone**: one :func:`~trainyard.scheduling.admission.policy.plan` over every entry (CPU-s);
* **a decision round**: one look of a waiting job (:meth:`~trainyard.scheduling.admission.ledger.Ledger.request`:
  a transaction that reads the queue, decides and writes what it admits), wall seconds, the median of 10;
* **the start estimates**: :func:`~trainyard.scheduling.admission.starts.estimate_starts` over the queue,
  with a history, as ``trainyard queue`` computes them (CPU-s);
* **admissions per second**: ``--procs`` processes, each a triggerer's worth of waiting jobs, look at one
  of their waiting jobs at a time and end each of their jobs as soon as a decision admitted it
  (:meth:`~.Ledger.release`), until ``--admit`` jobs are admitted: every look a full decision over the
  whole queue, as in the platform, without the log line a look writes when its verdict changes (its place
  and start, from the estimates above, computed once per state of the queue). Kueue's scheduler benchmark
  admits 15,000 workloads in 351 s, about 43 a second;
* **a look against the history**: the decision round again with ``--history`` finished jobs in the ledger
  (holds and wait ratios, arrivals, cancellations within their kept time): a look's cost must not grow
  with it.

The queue is written straight into the ledger's tables (as ``request`` would write it, without a decision
per row): 10,000 decisions to fill it would take longer than everything measured.

    .venv/bin/python bench/admission_scale.py [--waiting 1000 10000] [--procs 4] [--admit 600] [--history 100000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "include"))

import airflow_services  # noqa: E402

from trainyard.scheduling.admission.ledger import JOB_COLUMNS, JOB_VALUES, Ledger, _job_row  # noqa: E402
from trainyard.scheduling.admission.policy import Job, PreemptionRules, plan  # noqa: E402
from trainyard.scheduling.admission.starts import estimate_starts  # noqa: E402
from trainyard.scheduling.resources import ResourcesConfig, load_resources  # noqa: E402

TYPES = ("v100-16gb", "a100-80gb", "h100-80gb")
DAY = 24 * 3600.0


def queue(config: ResourcesConfig, n: int, seed: int) -> list[Job]:
    """``n`` waiting jobs of the teams with a quota, on the GPU types, mostly of one slot (as the replay's)."""
    rng = random.Random(seed)
    teams = sorted(t for t in config.teams if any(config.quota(t, g) for g in TYPES))
    jobs = []
    for i in range(n):
        gpu_type = rng.choice(TYPES)
        slots = min(rng.choices((1, 2, 4, 8), (70, 15, 10, 5))[0], config.gpu_types[gpu_type].slots)
        jobs.append(Job(f"train/{i:05d}", rng.choice(teams), gpu_type, slots, rng.choice((50, 100, 200)), 4.0))
    return jobs


def fill(ledger: Ledger, jobs: list[Job], history: int) -> None:
    """The jobs waiting (arrived a second apart, leases of a day), and ``history`` finished jobs' traces."""
    now = ledger.now()
    with ledger.db.transaction() as conn:
        for i, job in enumerate(jobs):
            at = now - len(jobs) + i
            conn.execute("INSERT INTO arrivals (id, enqueued) VALUES (?, ?)", (job.id, at))
            conn.execute(
                f"INSERT INTO admission ({JOB_COLUMNS}, enqueued, lease_until) VALUES ({JOB_VALUES}, ?, ?)",
                (*_job_row(job), at, now + DAY),
            )
        rng = random.Random(1)
        teams = sorted(ledger.config.teams)
        for i in range(history):
            at = now - rng.uniform(0, 6 * DAY)  # within what every table keeps
            conn.execute(
                "INSERT INTO holds (id, team, share, at) VALUES (?, ?, ?, ?)",
                (f"old/{i}", rng.choice(teams), rng.random(), at),
            )
            conn.execute(
                "INSERT INTO wait_ratios (id, ratio, at) VALUES (?, ?, ?)", (f"old/{i}", rng.uniform(0.3, 3), at)
            )
            conn.execute("INSERT INTO arrivals (id, enqueued) VALUES (?, ?)", (f"old/{i}", at))
            conn.execute("INSERT INTO cancelled (id, at, reason) VALUES (?, ?, ?)", (f"gone/{i}", at, "cancelled"))


def decision_round_s(ledger: Ledger, jobs: list[Job], looks: int = 10) -> float:
    """The median wall time of a look of a job at the back of the queue (the whole queue decided)."""
    times = []
    for job in jobs[-looks:]:
        started = time.perf_counter()
        ledger.request(job)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _drain(url: str, resources: str | None, mine: list[Job], admitted, until: int, seed: int) -> None:
    """One triggerer's worth of jobs: a look of one of its waiting jobs (a decision over the whole queue),
    then every one of its jobs that some decision admitted ends at once; until ``until`` are admitted."""
    ledger = Ledger(url, load_resources(resources))
    waiting, rng = {job.id: job for job in mine}, random.Random(seed)
    while admitted.value < until and waiting:
        ledger.request(waiting[rng.choice(list(waiting))])
        with ledger.db.connection() as conn:
            done = ledger.admitted_ids(conn) & waiting.keys()
        for job_id in done:
            ledger.release(job_id)
            del waiting[job_id]
        with admitted.get_lock():
            admitted.value += len(done)


def admissions_per_second(url: str, resources: str | None, jobs: list[Job], procs: int, admit: int) -> float:
    """``procs`` processes look at their own waiting jobs, each ending its jobs once admitted, until
    ``admit`` are admitted: admissions per wall second."""
    context = multiprocessing.get_context("spawn")
    admitted = context.Value("i", 0)
    workers = [
        context.Process(target=_drain, args=(url, resources, jobs[k::procs], admitted, admit, k)) for k in range(procs)
    ]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return admitted.value / (time.perf_counter() - started)


def measure(server: airflow_services.Postgres, args: argparse.Namespace, n: int) -> dict:
    config = load_resources(args.resources)
    jobs = queue(config, n, seed=n)
    figures: dict = {"waiting": n}
    for history in (0, args.history):
        url = server.database(f"scale_{n}_{history}")
        ledger = Ledger(url, config)
        fill(ledger, jobs, history)
        _vacuum(url)  # as autovacuum would soon after: the bulk insert's tables analyzed, its pages settled
        figures[f"decision_round_s_history_{history}"] = round(decision_round_s(ledger, jobs), 3)
    entries = ledger.entries()
    started = time.process_time()
    plan(config, entries, ledger.now(), None, PreemptionRules.of(config))
    figures["plan_cpu_s"] = round(time.process_time() - started, 3)
    started = time.process_time()
    estimates = estimate_starts(config, entries, ledger.now(), None, ledger.history())
    figures["estimates_cpu_s"] = round(time.process_time() - started, 3)
    figures["jobs_given_a_start"] = sum(e.latest is not None for e in estimates.values())
    url = server.database(f"drain_{n}")
    fill(Ledger(url, config), jobs, 0)
    figures["admissions_per_s"] = round(admissions_per_second(url, args.resources, jobs, args.procs, args.admit), 1)
    return figures


def _vacuum(url: str) -> None:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", nargs="+", type=int, default=[1000, 10000])
    parser.add_argument("--procs", type=int, default=4, help="processes looking at once (triggerers)")
    parser.add_argument("--admit", type=int, default=600, help="admissions to time per queue length")
    parser.add_argument("--history", type=int, default=100_000, help="finished jobs in the ledger for the last look")
    parser.add_argument("--resources", help="the fleet (default: include/config/resources.yaml)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    server = airflow_services.Postgres().start()
    try:
        rows = []
        for n in args.waiting:
            r = measure(server, args, n)
            rows.append(r)
            print(
                f"{n} waiting: a decision round {r['decision_round_s_history_0']:.3f} s "
                f"({r['decision_round_s_history_' + str(args.history)]:.3f} s with {args.history} finished jobs in "
                f"the history), the policy alone {r['plan_cpu_s']:.3f} CPU-s, start estimates "
                f"{r['estimates_cpu_s']:.3f} CPU-s ({r['jobs_given_a_start']} jobs given a start), "
                f"{r['admissions_per_s']:.1f} admissions/s "
                f"({args.procs} processes looking)",
                flush=True,
            )
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
    finally:
        server.stop()  # and its data folder (stop_server kept it: a folder in /tmp left by every run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
