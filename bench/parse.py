"""DAG parse time per file, as Airflow's DAG processor sees it.

Each file of ``dags/`` is parsed by ``DagBag`` in a fresh process that has imported Airflow first (the
DAG processor has; what a file imports beyond that is its own cost): "first" is that parse, "again" the
median of ``--reps`` parses after it in the same process (modules cached, as a long-running processor
parses a file every ``min_file_process_interval``). Airflow's default ``dagbag_import_timeout`` is 30 s.

    AIRFLOW_HOME=.airflow .venv/bin/python bench/parse.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from child_process import child_result

DAGS = Path(__file__).resolve().parents[1] / "dags"


def child(path: str, reps: int) -> None:
    import airflow  # noqa: F401 - the processor's own imports are not the file's cost
    from airflow.dag_processing.dagbag import DagBag

    def once() -> tuple[float, int]:
        bag = DagBag(dag_folder=path, safe_mode=False)
        if bag.import_errors:
            raise SystemExit(f"{path}: {bag.import_errors}")
        stat = bag.dagbag_stats[0]
        return stat.duration.total_seconds(), stat.task_num

    first, tasks = once()
    again = statistics.median(once()[0] for _ in range(reps))
    print(json.dumps({"first_s": first, "again_s": again, "tasks": tasks}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.reps)
        return
    print(f"{'file':22} {'tasks':>5} {'first parse':>12} {'again':>10}")
    # Each team's DAGs are these files read in its bundle (multi-team mode), where they make the same DAG as
    # without it: what a file costs is measured once, as the one DAG of every team.
    sys.path.insert(0, str(DAGS.parent / "plugins"))
    from trainyard_airflow.team_dags import IN_PROCESS_ENV

    env = {**os.environ, **IN_PROCESS_ENV}
    for path in sorted(DAGS.glob("*.py")):
        r = child_result([__file__, "--child", str(path), "--reps", str(args.reps)], env)
        print(f"{path.name:22} {r['tasks']:>5} {r['first_s'] * 1e3:>9.0f} ms {r['again_s'] * 1e3:>7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
