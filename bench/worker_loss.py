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

from child_process import figures_of_test


def main() -> None:
    (figure,) = figures_of_test(
        "tests/integration/test_cluster_profile.py",
        "host_dies",
        lambda line: line.startswith("worker ") and " killed: " in line,
        1,
    )
    print("a GPU host's Celery worker SIGKILLed with everything under it mid-training (with Airflow's default")
    print("task heartbeat timeout, 300 s, the retry started 313 s after the death, tried as a new user would):")
    print("  " + figure)


if __name__ == "__main__":
    main()
