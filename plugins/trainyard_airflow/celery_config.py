"""The CeleryExecutor's app configuration (``[celery] celery_config_options``): Airflow's own, and workers
that preload ``[trainyard] preload_modules`` as the PreloadingLocalExecutor's scheduler does.

A Celery worker runs each task in a process forked from its pool, which it forks when it starts; without
this, every task process imported torch, MLflow, great-expectations and onnxruntime again. The worker
imports them once, at Celery's ``worker_init`` (before the pool is forked), and its tasks share them
copy-on-write. The scheduler, which reads this module to send tasks, imports nothing more.
"""

from __future__ import annotations

import logging

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_init

# Airflow's own settings object itself, not a copy: Airflow builds a team's settings from its own [celery]
# options and applies a configured object on top of them unless it is this one. What this module adds is
# the hook.
CELERY_CONFIG = DEFAULT_CELERY_CONFIG


@worker_init.connect
def _preload_before_the_pool_forks(**_) -> None:
    from trainyard_airflow.executors import preload

    preload(logging.getLogger("trainyard.celery_worker"))
