"""A dead Celery worker on the cluster profile: from its death to its job training again on another host.

The cluster profile (PostgreSQL, Redis, MLflow, Airflow with the CeleryExecutor, two GPU hosts of the ``cpu``
type) runs a digits training; once it has trained past a checkpoint, the Celery worker that runs it is killed
with SIGKILL, every process under it too, as when its host dies. Airflow fails the try once the scheduler has
not heard from it for the profile's ``task_instance_heartbeat_timeout`` (``scripts/cluster.py``:
``TASK_HEARTBEAT_TIMEOUT_S``), and the retry resumes from the checkpoint on the other host. This is the test
``tests/integration/test_cluster_profile.py`` runs for it (``-k host_dies``, which also checks that a
training paused past the timeout is no false alarm and restarts PostgreSQL under the retry), timed by the test
from the kill. About six minutes with the cluster's start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST = "tests/integration/test_cluster_profile.py"


def main() -> None:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", TEST, "-k", "host_dies"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    figures = [line for line in done.stdout.splitlines() if line.startswith("worker ") and " killed: " in line]
    if done.returncode or len(figures) != 1:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout[-4000:]}")
    print("a GPU host's Celery worker SIGKILLed with everything under it mid-training (with Airflow's default")
    print("task heartbeat timeout, 300 s, the retry started 313 s after the death, tried as a new user would):")
    print("  " + figures[0])


if __name__ == "__main__":
    main()
