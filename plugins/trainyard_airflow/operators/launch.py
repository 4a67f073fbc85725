"""A parse-time-light front for the Kubernetes training operator.

Importing the cncf.kubernetes operators (and the kubernetes client) costs ~0.9 s, which every DAG parse
would pay; this operator imports nothing heavy and builds the real ``KubernetesTrainingJobOperator`` (or
the single-node Pod operator) inside ``execute``, where the cost belongs. The trade: it runs the inner
operator synchronously, so the task is not deferrable (it holds a worker slot while the Job runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class KubernetesTrainingLauncher(BaseOperator):
    template_fields: Sequence[str] = ("spec", "run_key", "config_path")

    def __init__(self, *, spec: Any, run_key: str, config_path: Any, kubernetes_conn_id: str = "kubernetes_default",
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec, self.run_key, self.config_path = spec, run_key, config_path
        self.kubernetes_conn_id = kubernetes_conn_id

    def execute(self, context):
        from trainyard_airflow.operators.training import KubernetesTrainingJobOperator, KubernetesTrainingPodOperator

        kind = KubernetesTrainingJobOperator if self.spec["resources"]["nodes"] > 1 else KubernetesTrainingPodOperator
        inner = kind(
            task_id=self.task_id,
            spec=self.spec,
            run_key=self.run_key,
            config_path=self.config_path,
            kubernetes_conn_id=self.kubernetes_conn_id,
            namespace=self.spec["kubernetes"]["namespace"],
        )
        return inner.execute(context)
