"""Many jobs preempted at once under the real executor, each resumed to its end with one model version.

An Airflow of the tests (api-server, scheduler, dag-processor, a triggerer per team, the LocalExecutor) with
``--borrowers`` + 1 CPU slots, all team default's quota. alice (team vision, no CPU quota) starts that many
digits jobs of one slot each on the slots team default lends; once every one has written a checkpoint, tina
(team default) asks for all of her team's slots. The ledger preempts every borrower: each one's workers
stop at a step with a checkpoint there, its task waits again (not failed, no retry used), tina's job
trains and ends, and each borrower resumes at the step it stopped at and registers one model version.
The test ``tests/integration/test_preemption_under_the_executor.py`` does this with one borrower in the
suite; here with ``--borrowers`` of them (the goal: 20 of 20). About 21 minutes on 2 cores for 20.
"""

from __future__ import annotations

import argparse
import os

from child_process import figures_of_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--borrowers", type=int, default=20, help="jobs preempted at once (default 20)")
    args = parser.parse_args()
    env = {**os.environ, "TRAINYARD_BENCH_BORROWERS": str(args.borrowers)}
    (figure,) = figures_of_test(
        "tests/integration/test_preemption_under_the_executor.py",
        "lender",
        lambda line: line.startswith("preempted at once"),
        1,
        env,
    )
    print(f"{args.borrowers} borrowers' digits jobs on 1 CPU slot each, preempted by one job of the lending team:")
    for part in figure.split("; "):
        print("  " + part)


if __name__ == "__main__":
    main()
