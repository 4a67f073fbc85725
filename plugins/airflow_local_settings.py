"""Airflow cluster policies for trainyard (Airflow imports this module from the plugins folder)."""

from trainyard_airflow.policy import task_instance_mutation_hook

__all__ = ["task_instance_mutation_hook"]
