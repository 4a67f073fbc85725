"""Node loss on the Kubernetes path: the elastic going-on against waiting for the Job's new pod.

A 2-node digits job (one process per pod, 60 epochs of batch 8, a checkpoint every 50 steps) runs as the two
pods of its rendered Indexed Job, each in a network namespace of its own; pod 1 and everything in it is killed
1 s after the first checkpoint (mid-epoch), and the Job's new pod for index 1 is started 30 s later, as the Job
controller would start it (on a cluster: the node's NotReady, then ``NODE_LOST_S``, then the pod's start).
Once with ``resources.min_nodes: 1`` (elastic) and once without (the nodes left wait for the new pod): the
test of ``tests/integration/test_multinode_namespaces.py`` that the suite runs elastic only, each mode timed
by the test itself from the kill. Needs root, ``ip`` and ``bwrap``; about two minutes.
"""

from __future__ import annotations

import os

from child_process import figures_of_test


def main() -> None:
    env = {**os.environ, "TRAINYARD_BENCH_NODE_LOSS": "1"}  # the test's second mode, left out of the suite
    figures = figures_of_test(
        "tests/integration/test_multinode_namespaces.py",
        "pod_lost",
        lambda line: line.startswith("node loss ("),
        2,
        env,
    )
    print("pod 1 of 2 killed mid-epoch; the Job's new pod for it started 30 s later (one process a pod, 2 cores)")
    for line in figures:
        print("  " + line.removeprefix("node loss "))


if __name__ == "__main__":
    main()
