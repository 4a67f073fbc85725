"""The Kubernetes API calls of the training operators (operators/training.py), beside the provider's own:
the provider's KubernetesHook creates the Job and reads a Pod; this adds what a training's try needs besides
(its headless Service, its pods by label, the Jobs an earlier try left, deleting each), as the cncf.kubernetes
provider keeps API calls in hooks and decisions in operators. A delete of an object already gone is no error."""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException


class TrainingHook(KubernetesHook):
    """KubernetesHook with the objects of a training's try."""

    def create_service(self, service: k8s.V1Service, namespace: str) -> k8s.V1Service:
        return self.core_v1_client.create_namespaced_service(namespace=namespace, body=service)

    def list_pods(self, namespace: str, label_selector: str) -> list[k8s.V1Pod]:
        return self.core_v1_client.list_namespaced_pod(namespace=namespace, label_selector=label_selector).items

    def read_pod(self, name: str, namespace: str) -> k8s.V1Pod | None:
        """The pod (the provider's :meth:`get_pod`), or None where it is gone."""
        try:
            return self.get_pod(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list_jobs(self, namespace: str, label_selector: str) -> list[k8s.V1Job]:
        return self.batch_v1_client.list_namespaced_job(namespace=namespace, label_selector=label_selector).items

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        """Delete the ``kind`` (Job, Service or Pod) ``name``; a Job with its pods (in the background).
        False where it was already gone; other API errors are raised."""
        calls = {
            "Job": lambda: self.batch_v1_client.delete_namespaced_job(
                name=name, namespace=namespace, propagation_policy="Background"
            ),
            "Service": lambda: self.core_v1_client.delete_namespaced_service(name=name, namespace=namespace),
            "Pod": lambda: self.core_v1_client.delete_namespaced_pod(name=name, namespace=namespace),
        }
        try:
            calls[kind]()
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True
