"""Airflow cluster policies for trainyard (Airflow imports this module from the plugins folder)."""

from trainyard.training.launchers.sandbox import private_umask
from trainyard_airflow.policy import pod_mutation_hook, task_instance_mutation_hook

__all__ = ["pod_mutation_hook", "task_instance_mutation_hook"]

# Every Airflow process (and the tasks and workers it starts) creates files for its own user and group
# only (the Kubernetes pods share group 0; the sandbox users never do): what a sandboxed custom command may
# search on its way to its run leads to nothing else it could read.
private_umask()
