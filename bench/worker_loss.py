"""A dead Celery worker, and a lost node of a 2-node job, on the cluster profile: from the death to training
again.

The cluster profile (PostgreSQL, Redis, MLflow, Airflow with the CeleryExecutor, two GPU hosts of the ``cpu``
type, each in a network namespace of its own where this machine allows it) runs two trainings, as the tests
``tests/integration/test_cluster_profile.py`` do, timed by the tests from the kill:

- a 2-node digits job, elastic down to one node (``-k two_node``): once both nodes train past a checkpoint,
  node 1's host (its Celery worker and everything under it) is killed with SIGKILL; node 0 goes on alone from
  the newest checkpoint, without a retry of its own. Timed to node 0's first checkpoint written alone.
- a one-node digits job (``-k host_dies``): once it has trained past a checkpoint, the Celery worker that runs
  it is killed the same way. Airflow fails the try once the scheduler has not heard from it for the
  profile's ``task_instance_heartbeat_timeout`` (``scripts/cluster.py``: ``TASK_HEARTBEAT_TIMEOUT_S``), and
  the retry resumes from the checkpoint on the other host (plain checkpoint-restart). The test also checks
  that a training paused past the timeout is no false alarm and restarts PostgreSQL under the retry.

About eight minutes with the cluster's start.
"""

from __future__ import annotations

from child_process import figures_of_test


def main() -> None:
    figures = figures_of_test(
        "tests/integration/test_cluster_profile.py",
        "two_node or host_dies",
        lambda line: " killed: " in line and line.startswith(("worker ", "node 1's host")),
        2,
    )
    print("a host SIGKILLed with everything under it mid-training (with Airflow's default task heartbeat")
    print("timeout, 300 s, a one-node job's retry started 313 s after the death, tried as a new user would):")
    for figure in figures:
        print("  " + figure)


if __name__ == "__main__":
    main()
