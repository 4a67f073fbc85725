"""trainyard's Airflow cluster policies: per-run GPU reservation, and team policy on every pod.

Per-run GPU reservation: route a training task to the pool, slots and priority its JobSpec asks for.

Airflow fixes ``pool`` and ``pool_slots`` when a DAG is parsed, but a JobSpec arrives per run (trigger
form, REST ``conf``). Airflow's ``task_instance_mutation_hook`` runs in the scheduler when task instances
are created, with the run at hand, so it is where ``resources.gpu_type`` (on a MIG type with its
``mig_profile``: :attr:`trainyard.spec.Resources.slot_type`) becomes the pool,
``resources.nodes x gpus_per_node`` the pool_slots (a gang reservation: all of the job's GPUs or none; a
local training's task of one node of several, :data:`PER_NODE_TASKS`, its node's)
and ``resources.priority`` the priority_weight, above every other task's (:func:`training_priority`).

It touches only tasks already placed in a GPU pool (``gpu-*``) by their DAG, and only when the run's
conf carries ``resources``; an invalid conf is left alone, because the first task rejects it with a
message naming the field.

Where ``[trainyard] training_queue`` is set (the cluster profile: ``gpu``), the same hook sends every task of
a GPU pool (the trainings) to its GPU type's queue, ``gpu-<type>``
(:func:`trainyard.scheduling.hosts.training_queue_of`): only the Celery workers of hosts with that type serve
it (``trainyard worker`` serves the types of its host's inventory), while the rest goes to ``[operators]
default_queue``.

Team policy on pods (``pod_mutation_hook``): the JobSpec's team policy is checked in ``validate_spec`` and
where the pods are built; this hook checks the pod itself, so whatever builds a pod labelled for a team
cannot give it a namespace, service account, image or priority class the team may not use. Airflow runs
the policies of installed packages after this module's, so trainyard's operators check their pods once
more after all of them (``operators.training._mutate``).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Training tasks outrank every other task in the executor's queue: an admitted job's GPUs wait for its
# training, so its training must not wait for a worker behind other runs' data preparation (whose weights,
# the downstream rule's task counts, stay far below this).
TRAINING_PRIORITY_BASE = 1000


def training_priority(priority: int) -> int:
    """A training task's priority_weight for ``resources.priority`` (1-1000): their order is kept."""
    return TRAINING_PRIORITY_BASE + priority


# A local training's tasks each run one node (node 0, `train`, and each other node of a multi-node job) and hold
# its GPUs, so the pool counts a job's GPUs once over its nodes (a job of one node: all of them); a Kubernetes
# training's task holds all of its pods'.
PER_NODE_TASKS = frozenset({"train", "train_node"})


def reservation(conf: dict | None, per_node: bool = False) -> tuple[str, int, int] | None:
    """(pool, pool_slots, priority_weight) for a run's conf, or None to keep the DAG's own values; ``per_node``:
    for the task of one node."""
    from pydantic import ValidationError

    from trainyard.form import ConfError, spec_input
    from trainyard.scheduling.resources import pool_name
    from trainyard.spec import Resources

    try:
        resources = spec_input(conf).get("resources") if isinstance(conf, dict) else None
        if not isinstance(resources, dict):
            return None
        res = Resources.model_validate(resources)
    except (ConfError, ValidationError):
        return None
    return pool_name(res.slot_type), res.gpus_per_node if per_node else res.total_gpus, training_priority(res.priority)


def on_kubernetes(conf: dict | None) -> bool:
    """Whether a run's conf asks for the Kubernetes launcher (``backends.launcher``, either shape)."""
    from trainyard.form import ConfError, spec_input

    try:
        backends = spec_input(conf).get("backends") if isinstance(conf, dict) else None
    except ConfError:
        return False
    return isinstance(backends, dict) and backends.get("launcher") == "kubernetes"


def pod_mutation_hook(pod) -> None:
    """Airflow's pod cluster policy, run on every pod an operator builds (trainyard's operators call it
    after building theirs, and check the pod once more after every policy has run): a pod labelled for a
    team must keep to that team's policy, whoever built it; what it may not have is named (SpecError: the
    task fails, without a retry)."""
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import check_pod, pod_team

    if pod_team(pod) is None:  # not trainyard's pod: nothing of resources.yaml is read for it
        return
    check_pod(pod, resources_in_force())  # a typo in the file fails no pod: the last good one holds


def task_instance_mutation_hook(task_instance, dag_run=None) -> None:
    """Airflow calls it when it makes a task instance (without the run, then again with it) and when one
    is cleared: each call decides anew from the run's conf where there is one."""
    from trainyard.scheduling.hosts import routing_prefix, training_queue_of
    from trainyard.scheduling.resources import POOL_PREFIX

    if not (task_instance.pool or "").startswith(POOL_PREFIX):
        return
    conf = None if dag_run is None else getattr(dag_run, "conf", None)
    found = reservation(conf, per_node=task_instance.task_id in PER_NODE_TASKS)
    if found is not None:
        task_instance.pool, task_instance.pool_slots, task_instance.priority_weight = found
    prefix = routing_prefix()
    if not prefix:  # LocalExecutor: one queue
        return
    if on_kubernetes(conf):  # its pods get GPUs on the cluster: its worker needs none, the task's own queue
        task = getattr(task_instance, "task", None)
        task_instance.queue = getattr(task, "queue", None) or default_queue()
    else:  # to the workers of the hosts with its GPU type (Celery)
        task_instance.queue = training_queue_of(prefix, task_instance.pool.removeprefix(POOL_PREFIX))


def default_queue() -> str:
    from airflow.configuration import conf

    return conf.get("operators", "default_queue")
