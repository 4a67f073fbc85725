from trainyard_airflow.operators.training import KubernetesTrainingJobOperator, KubernetesTrainingPodOperator

__all__ = ["KubernetesTrainingJobOperator", "KubernetesTrainingPodOperator"]
