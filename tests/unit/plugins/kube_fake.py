"""An in-process Kubernetes API server for the resources trainyard's operators use (Jobs, Pods, Services).

It answers at the HTTP layer: ``api_client()`` is a real ``kubernetes.client.ApiClient`` whose urllib3 pool
manager is this object, so the kubernetes client, the provider's ``KubernetesHook`` and ``PodManager``
and the operators above them all run their own code, and a test asserts on what is left in the
"cluster" (``names``), not on which methods were called.

What it does of a cluster's work: the Job controller creates one pod per completion index (labels,
annotations and owner reference as Kubernetes sets them); deleting a Job deletes its pods unless
``propagationPolicy=Orphan``, and the garbage collector deletes what a deleted object owned (the headless
Service). The test moves the pods along (``schedule``, ``finish``) as the scheduler and kubelet would, and
a Job through a preemption (``suspend``, ``readmit``) as Kueue would.
``on_request`` lets a test act in the middle of an operator's work (a kill, a timeout), as a signal
handler would.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlsplit

import urllib3
from kubernetes import client

ROUTE = re.compile(
    r"^/(?:api/v1|apis/batch/v1)/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|services|jobs)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log))?$"
)
KINDS = {"pods": ("Pod", "v1"), "services": ("Service", "v1"), "jobs": ("Job", "batch/v1")}
INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(labels: dict, selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKubernetes:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name) -> object
        self.logs: dict[str, str] = {}  # pod name -> its trainer container's log
        self.requests: list[tuple[str, str]] = []
        self.on_request: Callable[[str, str], None] | None = None
        self._uids = itertools.count(1)
        self._rounds: dict[str, int] = {}  # a Job's pods made anew after suspensions

    # -- what tests use ----------------------------------------------------------------------------------
    def api_client(self) -> client.ApiClient:
        config = client.Configuration()
        config.host = "http://fake-kubernetes"
        api = client.ApiClient(config)
        api.rest_client.pool_manager = self
        return api

    def names(self, plural: str) -> list[str]:
        return sorted(name for (p, _, name) in self.objects if p == plural)

    def pods_of(self, job: str) -> list[dict]:
        return [
            o
            for (p, _, _), o in sorted(self.objects.items())
            if p == "pods" and o["metadata"]["labels"].get(JOB_NAME) == job
        ]

    def schedule(self, pods: list[dict], *, started: float) -> None:
        """The scheduler places the pods and the kubelet starts their trainer containers at ``started``."""
        for pod in pods:
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [self._container(pod, {"running": {"startedAt": iso(started)}})],
            }

    def finish(self, pods: list[dict], *, started: float, finished: float, exit_code: int = 0) -> None:
        """The trainer containers ran from ``started`` to ``finished``; the Job controller sees it."""
        for pod in pods:
            pod["status"] = {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    self._container(
                        pod,
                        {
                            "terminated": {
                                "exitCode": exit_code,
                                "startedAt": iso(started),
                                "finishedAt": iso(finished),
                                "reason": "Completed" if exit_code == 0 else "Error",
                            }
                        },
                    )
                ],
            }
            owner = pod["metadata"]["labels"].get(JOB_NAME)
            if owner:
                job = self.objects[("jobs", pod["metadata"]["namespace"], owner)]
                kind = "Complete" if exit_code == 0 else "Failed"
                job["status"] = {
                    "conditions": [
                        {
                            "type": kind,
                            "status": "True",
                            "reason": "Completed" if exit_code == 0 else "BackoffLimitExceeded",
                            "message": "" if exit_code == 0 else "Job has reached the specified backoff limit",
                        }
                    ],
                    ("succeeded" if exit_code == 0 else "failed"): 1,
                }

    # -- the HTTP side (urllib3.PoolManager.request) -------------------------------------------------------
    def request(self, method, url, fields=None, body=None, preload_content=True, timeout=None, headers=None, **_):
        parts = urlsplit(url)
        query = {**dict(parse_qsl(parts.query)), **dict(fields or [])}
        self.requests.append((method, parts.path))
        if self.on_request:
            self.on_request(method, parts.path)
        status, payload = self._handle(method, parts.path, query, json.loads(body) if body else None)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return urllib3.HTTPResponse(
            body=io.BytesIO(data),
            status=status,
            reason="OK" if status < 300 else "Error",
            headers={"Content-Type": "application/json"},
            preload_content=preload_content,
        )

    def _handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict | bytes]:
        m = ROUTE.match(path)
        if not m:
            return 404, self._status(404, f"no route {path}")
        ns, plural, name, sub = m["ns"], m["plural"], m["name"], m["sub"]
        key = (plural, ns, name)
        if name is None and method == "POST":
            return self._create(plural, ns, body or {})
        if name is None and method == "GET":
            kind, version = KINDS[plural]
            items = [
                o
                for (p, n, _), o in sorted(self.objects.items())
                if p == plural
                and n == ns
                and matches(o["metadata"].get("labels") or {}, query.get("labelSelector", ""))
            ]
            return 200, {"kind": f"{kind}List", "apiVersion": version, "metadata": {}, "items": items}
        if key not in self.objects:
            return 404, self._status(404, f'{plural} "{name}" not found')
        if method == "GET":
            return (200, self.logs.get(name, "").encode()) if sub == "log" else (200, self.objects[key])
        if method == "PATCH":  # a merge patch of the labels and of the spec's top-level fields
            labels = ((body or {}).get("metadata") or {}).get("labels") or {}
            self.objects[key]["metadata"].setdefault("labels", {}).update(labels)
            self.objects[key].setdefault("spec", {}).update((body or {}).get("spec") or {})
            return 200, self.objects[key]
        if method == "DELETE":
            self._delete(key, query.get("propagationPolicy", "Background"))
            return 200, self._status(200, "deleted")
        return 405, self._status(405, method)

    def _create(self, plural: str, ns: str, body: dict) -> tuple[int, dict]:
        name = body["metadata"]["name"]
        if (plural, ns, name) in self.objects:
            return 409, self._status(409, f'{plural} "{name}" already exists')
        obj = copy.deepcopy(body)
        obj["metadata"].update(namespace=ns, uid=f"uid-{next(self._uids)}", creationTimestamp=iso(0))
        obj.setdefault("status", {"phase": "Pending"} if plural == "pods" else {})
        self.objects[(plural, ns, name)] = obj
        if plural == "jobs":  # the Job controller
            self._make_pods(obj, ns)
        return 201, obj

    def _make_pods(self, job: dict, ns: str, round_: int = 0) -> None:
        """The Job controller's pods of ``job``, one per completion index; ``round_``: made anew after a
        suspension (new names, as the controller's random suffixes)."""
        name, template = job["metadata"]["name"], job["spec"]["template"]
        for index in range(job["spec"].get("parallelism") or 1):
            meta = template.get("metadata") or {}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "spec": copy.deepcopy(template["spec"]),
                "metadata": {
                    "name": f"{name}-{index}-{'xyz'[round_ % 3]}{index}",
                    "namespace": ns,
                    "uid": f"uid-{next(self._uids)}",
                    "labels": {**(meta.get("labels") or {}), JOB_NAME: name, "job-name": name, INDEX: str(index)},
                    "annotations": {**(meta.get("annotations") or {}), INDEX: str(index)},
                    "ownerReferences": [
                        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"]}
                    ],
                },
                "status": {
                    "phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                },
            }
            self.objects[("pods", ns, pod["metadata"]["name"])] = pod

    def suspend(self, job: str, ns: str) -> None:
        """Kueue preempts the Job: ``spec.suspend``; the Job controller stops its pods (they terminate within
        their grace, and are gone once :meth:`readmit` makes new ones)."""
        self.objects[("jobs", ns, job)]["spec"]["suspend"] = True

    def readmit(self, job: str, ns: str) -> None:
        """Kueue admits the suspended Job again: its stopped pods are gone and the controller makes new ones."""
        obj = self.objects[("jobs", ns, job)]
        obj["spec"]["suspend"] = False
        for pod in self.pods_of(job):
            del self.objects[("pods", ns, pod["metadata"]["name"])]
        self._rounds[job] = self._rounds.get(job, 0) + 1
        self._make_pods(obj, ns, self._rounds[job])

    def _delete(self, key: tuple[str, str, str], propagation: str) -> None:
        obj = self.objects.pop(key)
        if propagation == "Orphan":
            return
        uid = obj["metadata"]["uid"]
        for other_key, other in list(self.objects.items()):  # the garbage collector
            if other_key in self.objects and any(
                o.get("uid") == uid for o in other["metadata"].get("ownerReferences") or []
            ):
                self._delete(other_key, propagation)

    @staticmethod
    def _container(pod: dict, state: dict) -> dict:
        container = pod["spec"]["containers"][0]
        return {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": "running" in state,
            "restartCount": 0,
            "state": state,
        }

    @staticmethod
    def _status(code: int, message: str) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Success" if code < 300 else "Failure",
            "message": message,
            "code": code,
        }
