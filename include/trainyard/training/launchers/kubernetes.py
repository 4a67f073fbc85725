"""Kubernetes launcher: a JobSpec becomes an Indexed Job (one pod per node) and a headless Service.

Builders over the ``kubernetes`` client models, from one :class:`PodRequest` (no Airflow, no API call;
resources.yaml gives the node selector and the queue), and the launcher that plans a try and reads its
running time. What a team's pods may have is :mod:`trainyard.teams`' (``check_pod``). The Airflow operators
in ``plugins/trainyard_airflow/operators/training.py`` create, watch and delete what these functions build.

How the pods find each other: the Job is Indexed, so pod ``i`` gets the hostname ``<job>-<i>``; with
``subdomain`` = the headless Service, it resolves as ``<job>-<i>.<service>.<namespace>.svc.<domain>``.
Every built-in strategy runs **torchrun** in each pod as the per-node process launcher (``--nproc_per_node``
= the pod's GPUs) with the **c10d** rendezvous hosted by pod 0, because it needs nothing but TCP to pod 0:

- ddp: torchrun + DistributedDataParallel, as locally.
- deepspeed: ``deepspeed.init_distributed()`` takes RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/LOCAL_RANK from
  the environment torchrun sets. The ``deepspeed`` launcher is not used: across nodes it starts workers
  through pdsh/ssh, which the pods do not run.
- horovod: ``horovodrun`` starts remote workers through ssh (or the MPI Operator's kubectl-exec), which
  the pods do not run either. Horovod's gloo controller can start from environment variables instead
  (read in ``horovod/common/gloo/gloo_context.cc``: HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/
  CROSS_SIZE/HOSTNAME + HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, an HTTP key-value store as served by
  ``horovod.runner.http.http_server.RendezvousHTTPServer``). The pod env carries what is the same for
  every process (sizes, controller, port ``HOROVOD_RDZV_PORT``); the horovod trainer must map torchrun's
  RANK/LOCAL_RANK/GROUP_RANK to HOROVOD_RANK/LOCAL_RANK/CROSS_RANK, take the address from MASTER_ADDR (the
  node of global rank 0) and serve the rendezvous store in rank 0 before ``hvd.init()``.
- custom (bring your own): the user's command, one per pod, with MASTER_ADDR/MASTER_PORT (pod 0),
  NNODES/NODE_RANK/NPROC_PER_NODE and the one-process-per-pod RANK/WORLD_SIZE; Kubernetes expands
  ``$(NODE_RANK)`` etc. in the command. The TRAINYARD_* variables are
  :func:`trainyard.training.custom.platform_env`'s, as locally, with the shared volume's paths.

Paths: the worker and the pods mount one volume (``kubernetes.data_pvc``), the worker at its
TRAINYARD_HOME and the pods at ``/var/trainyard``. :class:`KubernetesLauncher` writes the run config the
pods read (``run_config.kubernetes.json``, every path under TRAINYARD_HOME rewritten with
:func:`in_pod`) and points TRAINYARD_DATA_DIR at the prepared split that ``prepare_data`` wrote there.

Why c10d and no ``--node_rank``: torchrun ignores node_rank outside the static backend; c10d assigns group
ranks itself and, unlike static, re-rendezvouses every node when one restarts (``--max_restarts``). Pod 0
hosts the store because the endpoint is its fully qualified name, which its own /etc/hosts already maps
(torch's ``_matches_machine_hostname``), so hosting does not wait for DNS; other pods retry name lookup
and connection until ``RDZV_TIMEOUT_S`` (launchers.base). Starting the gang together is the cluster's job (e.g. Kueue).
c10d numbers the nodes of a round in the order of their names, so pod 0 (``<job>-0.``, first) is group rank 0,
which writes the result, in every round it is in; an elastic Job's success is therefore pod 0's.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from trainyard import recipes
from trainyard.data.prepare import PreparedData
from trainyard.errors import PermanentError, spec_error_message
from trainyard.scheduling.cluster import TEAM_LABEL, label_value, mig_resource
from trainyard.scheduling.resources import ResourcesConfig, resources_in_force
from trainyard.spec import JobSpec, SpecError
from trainyard.training import custom
from trainyard.training.launchers.base import Interval, Launcher, rendezvous_args, time_left
from trainyard.training.preemption import GRACE_ENV, ON_SIGTERM_ENV
from trainyard.training.run_config import RunConfig, work_dir

TRAINER_UID = 50000  # the user the trainer image runs as (Dockerfile ARG TRAINER_UID)
TRAINYARD_HOME = "/var/trainyard"  # the data PVC's mount point in every pod
CONTAINER = "trainer"
RDZV_PORT = 29400
HOROVOD_RDZV_PORT = 29401
CLUSTER_DOMAIN = "cluster.local"
# the taints a node gets when it stops answering, and how long a training's pod stays on such a node
NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
NODE_LOST_S = 30
JOB_TTL_S = 24 * 3600  # the cluster removes a finished Job (and, by owner reference, its Service) a day later
NAME_MAX = 52  # leaves room for "-<index>" in the 63-character pod hostname
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# Set for readable, restartable logs; the user's kubernetes.env may replace them.
HINTS = (
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
)
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_TOLERATION_FIELDS = {
    "key": "key",
    "operator": "operator",
    "value": "value",
    "effect": "effect",
    "tolerationSeconds": "toleration_seconds",
}


def _bad(field: str, msg: str) -> SpecError:
    return SpecError(spec_error_message([f"{field}: {msg}"]))


def run_hash(run_key: str) -> str:
    """A label-safe, stable id for a run key (an Airflow run id holds ':' and '+', labels may not)."""
    return hashlib.sha256(run_key.encode()).hexdigest()[:16]


def job_name(spec: JobSpec, run_key: str, *, attempt: int = 1) -> str:
    """``<name>-<hash of name and run key>-<attempt>``: DNS-1035 (also the Service's name), <= 52 chars.

    The attempt (Airflow try number) keeps a retry from colliding with a Job of an earlier try that the
    cluster has not removed yet; the operator finds and deletes those by their labels."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    digest = hashlib.sha256(f"{spec.name}/{run_key}".encode()).hexdigest()[:8]
    tail = f"-{digest}-{attempt}"
    slug = re.sub(r"[^a-z0-9-]+", "-", spec.name).strip("-")
    if not slug[:1].isalpha():  # Service names must start with a letter
        slug = f"t-{slug}"
    return slug[: NAME_MAX - len(tail)].rstrip("-") + tail


def run_labels(spec: JobSpec, run_key: str) -> dict[str, str]:
    """The identity of a run's objects: the Service selects by these, the operator finds by these."""
    return {
        "app.kubernetes.io/name": "trainyard",
        "trainyard.io/job": label_value(spec.name),
        "trainyard.io/run": run_hash(run_key),
        TEAM_LABEL: label_value(spec.resources.team),
        "trainyard.io/gpu-type": label_value(spec.resources.gpu_type),
    }


def queue_labels(spec: JobSpec, resources: ResourcesConfig | None = None) -> dict[str, str]:
    """With ``scheduling.kueue``: the team's LocalQueue and the job's WorkloadPriorityClass (Kueue admits
    the workload; see ``trainyard cluster manifests``). Without: none."""
    from trainyard.scheduling import cluster

    config = resources or resources_in_force()
    if not config.scheduling.kueue:
        return {}
    return {
        cluster.QUEUE_LABEL: cluster.LOCAL_QUEUE,
        cluster.PRIORITY_LABEL: cluster.priority_class_name(config.priority_class(spec.resources.priority)),
    }


def _queued_priority_class(spec: JobSpec, resources: ResourcesConfig | None) -> str | None:
    """With Kueue, the PriorityClass of the job's priority (the cluster manifests create them)."""
    from trainyard.scheduling import cluster

    return queue_labels(spec, resources).get(cluster.PRIORITY_LABEL)


def gpu_resource(spec: JobSpec) -> tuple[str, int] | None:
    """The extended resource each pod asks for; None for ``gpu_type: cpu`` (CPU pods).

    A MIG profile assumes the NVIDIA device plugin's ``mixed`` strategy (``nvidia.com/mig-<profile>``)."""
    res = spec.resources
    if res.gpu_type == "cpu":
        if res.mig_profile:
            raise _bad("resources.mig_profile", f"needs a GPU type, not 'cpu' (got {res.mig_profile!r})")
        return None
    return (mig_resource(res.mig_profile) if res.mig_profile else "nvidia.com/gpu", res.gpus_per_node)


def pod_host(spec: JobSpec, run_key: str, index: int, *, attempt: int = 1) -> str:
    """Fully qualified DNS name of pod ``index`` (as in that pod's own /etc/hosts)."""
    name = job_name(spec, run_key, attempt=attempt)
    return f"{name}-{index}.{name}.{spec.kubernetes.namespace}.svc.{CLUSTER_DOMAIN}"


def worker_command(spec: JobSpec, run_key: str, config_path: str, *, attempt: int = 1) -> list[str]:
    """The container's argv (see the module docstring for the design per strategy)."""
    if spec.recipe == "custom":
        if spec.custom is None:
            raise _bad("custom", "recipe 'custom' needs the custom section (command, optional image)")
        return list(spec.custom.command)
    res = spec.resources
    argv = [
        "torchrun",
        f"--nproc_per_node={res.gpus_per_node}",
        f"--max_restarts={spec.distributed.max_restarts}",
        "--tee=3",
    ]  # tee + the prefix template in the env: each line names its global rank
    if res.nodes == 1:
        argv += ["--standalone", "--nnodes=1"]
    else:
        endpoint = f"{pod_host(spec, run_key, 0, attempt=attempt)}:{RDZV_PORT}"
        argv += rendezvous_args(spec, endpoint, job_name(spec, run_key, attempt=attempt))
    return argv + ["-m", "trainyard.training.entry", "--config", config_path]


def _times(quantity: str, n: int, field: str) -> str:
    """``n`` x a quantity, in the same unit: '500m' x 3 = '1500m', '16Gi' x 2 = '32Gi'."""
    m = _QUANTITY.match(quantity)
    if not m:
        raise _bad(field, f"not a Kubernetes quantity such as '4', '500m' or '16Gi' (got {quantity!r})")
    return f"{format((Decimal(m.group(1)) * n).normalize(), 'f')}{m.group(2) or ''}"


def _cores(quantity: str) -> int:
    from kubernetes.utils import parse_quantity

    return max(1, int(parse_quantity(_times(quantity, 1, "kubernetes.cpu_per_gpu"))))


def _resources(s: JobSpec) -> k8s.V1ResourceRequirements:
    """Requests = limits (Guaranteed QoS: a training pod is never the first one evicted). CPU and memory
    scale with the GPUs, or with the processes on a CPU pod."""
    n = s.resources.gpus_per_node
    amounts = {
        "cpu": _times(s.kubernetes.cpu_per_gpu, n, "kubernetes.cpu_per_gpu"),
        "memory": _times(s.kubernetes.memory_per_gpu, n, "kubernetes.memory_per_gpu"),
    }
    if gpu := gpu_resource(s):
        amounts[gpu[0]] = str(gpu[1])
    return k8s.V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def _index() -> k8s.V1EnvVarSource:
    """The pod's completion index, as the Job controller's own JOB_COMPLETION_INDEX reads it."""
    return k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path=INDEX_FIELD))


def _env(s: JobSpec, run_key: str, config_path: str, attempt: int, data_dir: str | None) -> list[k8s.V1EnvVar]:
    n, g = s.resources.nodes, s.resources.gpus_per_node
    run_dir = posixpath.dirname(config_path)
    # torchrun would otherwise give each worker 1 thread; each worker has cpu_per_gpu cores.
    hints = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(_cores(s.kubernetes.cpu_per_gpu))}
    if s.resources.gpu_type != "cpu":
        hints.update(NCCL_DEBUG="WARN", NCCL_SOCKET_IFNAME="^lo,docker")  # '^': any interface but these
    platform: dict[str, str | k8s.V1EnvVarSource] = {
        "TRAINYARD_HOME": TRAINYARD_HOME,
        "TRAINYARD_RUN_CONFIG": config_path,
        "TRAINYARD_NODE_INDEX": _index(),
    }
    if s.recipe == "custom":
        platform.update(
            MASTER_ADDR="localhost" if n == 1 else pod_host(s, run_key, 0, attempt=attempt),
            MASTER_PORT=str(RDZV_PORT),
            NNODES=str(n),
            NPROC_PER_NODE=str(g),
            NODE_RANK=_index(),
            RANK=_index(),
            WORLD_SIZE=str(n),
            LOCAL_RANK="0",  # one process per pod, unless the command forks
        )
        if data_dir is None:
            raise ValueError("recipe 'custom' needs data_dir: the prepared data's path in the pod (see in_pod)")
        platform.update(custom.platform_env(data_dir, run_dir, s.hyperparameters.model_dump(mode="json")))
    else:
        hints["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank ${rank}]:"  # torch's template, not a $(VAR)
        # A fresh rendezvous store per restart round; launchers/base.worker_env says what failure it avoids.
        platform["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        if s.distributed.strategy == "horovod":  # what is the same for every process; see the docstring
            platform.update(
                HOROVOD_CONTROLLER="gloo",
                HOROVOD_CPU_OPERATIONS="gloo",
                HOROVOD_GLOO_RENDEZVOUS_PORT=str(HOROVOD_RDZV_PORT),
                HOROVOD_SIZE=str(n * g),
                HOROVOD_LOCAL_SIZE=str(g),
                HOROVOD_CROSS_SIZE=str(n),
            )
    clash = sorted(set(s.kubernetes.env) & set(platform))
    if clash:
        raise _bad(
            "kubernetes.env",
            f"{clash} are set by the platform and cannot be replaced (hints such as {list(HINTS)} can)",
        )
    merged = {**hints, **platform, **s.kubernetes.env}
    return [
        k8s.V1EnvVar(name=k, value_from=v) if isinstance(v, k8s.V1EnvVarSource) else k8s.V1EnvVar(name=k, value=v)
        for k, v in merged.items()
    ]


def _tolerations(s: JobSpec) -> list[k8s.V1Toleration]:
    """The spec's tolerations, and, unless it names them, :data:`NODE_LOST_TAINTS` tolerated for
    :data:`NODE_LOST_S` only: a pod whose node stopped answering is evicted then (Kubernetes' default, 300 s,
    would hold the job's other pods at the rendezvous that long): its Job fails (``backoffLimit`` 0) and
    Airflow's retry resumes from the newest checkpoint. An elastic Job starts the pod again instead (its pod
    failure policy ignores the eviction, a ``DisruptionTarget``), and the new pod rejoins the nodes that went
    on without it."""
    out = []
    for i, t in enumerate(s.kubernetes.tolerations):
        unknown = sorted(set(t) - set(_TOLERATION_FIELDS))
        if unknown:
            raise _bad(
                f"kubernetes.tolerations.{i}", f"unknown field(s) {unknown}; allowed: {list(_TOLERATION_FIELDS)}"
            )
        out.append(k8s.V1Toleration(**{_TOLERATION_FIELDS[k]: v for k, v in t.items()}))
    if any(t.key is None and t.operator == "Exists" for t in out):  # it tolerates every taint, as it chose
        return out
    named = {t.key for t in out}
    out += [
        k8s.V1Toleration(key=key, operator="Exists", effect="NoExecute", toleration_seconds=NODE_LOST_S)
        for key in NODE_LOST_TAINTS
        if key not in named
    ]
    return out


def node_selector(spec: JobSpec, resources: ResourcesConfig | None = None) -> dict[str, str]:
    """The GPU type's selector from resources.yaml, plus (and overridden by) the spec's own."""
    config = resources or resources_in_force()
    gpu = config.gpu_types.get(spec.resources.gpu_type)
    if gpu is None:
        raise _bad(
            "resources.gpu_type", f"unknown GPU type {spec.resources.gpu_type!r}; allowed: {sorted(config.gpu_types)}"
        )
    return {**gpu.node_selector, **spec.kubernetes.node_selector}


def run_mounts(config_path: str, data_dir: str | None = None, inputs: Iterable[str] = ()) -> list[k8s.V1VolumeMount]:
    """What a pod sees of the shared volume: its run and nothing else. The run's ``work/`` read-write (its
    checkpoints, metrics file and model), its run config, prepared data and a recipe's input files
    read-only, each a ``subPath`` of the data volume at the path the run config names. Not the keys, the
    admission ledger, the audit trail, MLflow's store, the dataset store or any other run: the pod runs
    the team's code (or a team's own program) and may be hostile to every other team. ``config_path``,
    ``data_dir`` and ``inputs`` are pod paths (:func:`in_pod`); the run directory is the config's."""
    wanted = [(work_dir(posixpath.dirname(config_path)), False), (config_path, True)]
    wanted += [(p, True) for p in ([data_dir] if data_dir else [])]
    wanted += [(p, True) for p in inputs]
    mounts = []
    for path, read_only in dict.fromkeys(wanted):
        normal = posixpath.normpath(path)
        sub_path = posixpath.relpath(normal, TRAINYARD_HOME)
        if sub_path == "." or sub_path.startswith("../") or sub_path == ".." or not path.startswith("/"):
            raise PermanentError(f"{path}: a pod mounts only single files and folders below {TRAINYARD_HOME}")
        mounts.append(k8s.V1VolumeMount(name="data", mount_path=normal, sub_path=sub_path, read_only=read_only))
    return mounts


@dataclass(frozen=True)
class PodRequest:
    """What one try's pods are built from: the job, its run (``run_key``, ``attempt``), the run config and
    the prepared data as the pods see them (``config_path``, ``data_dir``; ``inputs``: a recipe's input
    files), and the fleet (``resources``; default: resources.yaml in force, read once per request)."""

    spec: JobSpec
    run_key: str
    config_path: str
    attempt: int = 1
    resources: ResourcesConfig | None = None
    data_dir: str | None = None
    inputs: tuple[str, ...] = ()

    def fleet(self) -> ResourcesConfig:
        return self.resources or resources_in_force()

    def name(self) -> str:
        return job_name(self.spec, self.run_key, attempt=self.attempt)

    def metadata(self, labels: dict[str, str]) -> k8s.V1ObjectMeta:
        """The try's object name in the job's namespace, with ``labels``."""
        return k8s.V1ObjectMeta(name=self.name(), namespace=self.spec.kubernetes.namespace, labels=labels)


def termination_grace(spec: JobSpec, config: ResourcesConfig) -> int:
    """Seconds the pods have from SIGTERM (Kueue's preemption, a deletion) to SIGKILL, to checkpoint and end:
    the JobSpec's ``kubernetes.termination_grace_s``, else resources.yaml's preemption grace."""
    return spec.kubernetes.termination_grace_s or max(1, int(config.scheduling.preemption.grace_seconds))


def pod_template(request: PodRequest, config: ResourcesConfig) -> k8s.V1PodTemplateSpec:
    """One node of the job: the trainer container with its run's part of the data PVC (:func:`run_mounts`;
    ``inputs``: a recipe's input files, pod paths) and a RAM-backed /dev/shm."""
    spec, run_key, config_path, attempt = request.spec, request.run_key, request.config_path, request.attempt
    k = spec.kubernetes
    ports = [k8s.V1ContainerPort(name="rendezvous", container_port=RDZV_PORT)]
    if spec.recipe != "custom" and spec.distributed.strategy == "horovod":
        ports.append(k8s.V1ContainerPort(name="hvd-rendezvous", container_port=HOROVOD_RDZV_PORT))
    grace = termination_grace(spec, config)
    container = k8s.V1Container(
        name=CONTAINER,
        image=(spec.custom.image if spec.custom and spec.custom.image else None) or k.image,
        image_pull_policy=k.image_pull_policy,
        command=worker_command(spec, run_key, config_path, attempt=attempt),
        # an eviction (Kueue's preemption) is SIGTERM: the workers' word to checkpoint (torchrun forwards it)
        env=[
            *_env(spec, run_key, config_path, attempt, request.data_dir),
            k8s.V1EnvVar(GRACE_ENV, str(grace)),
            k8s.V1EnvVar(ON_SIGTERM_ENV, "1"),
        ],
        ports=ports,
        resources=_resources(spec),
        volume_mounts=[
            *run_mounts(config_path, request.data_dir, request.inputs),
            k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ],
    )
    pod_spec = k8s.V1PodSpec(
        containers=[container],
        # The image's user (Dockerfile TRAINER_UID, group 0 like the Airflow image): never root, and the
        # shared volume's files group-owned by 0 so the worker and the pods can both write them.
        security_context=k8s.V1PodSecurityContext(
            run_as_non_root=True, run_as_user=TRAINER_UID, run_as_group=0, fs_group=0
        ),
        # Never: a crashed worker fails the Job (backoff 0) and Airflow decides whether to retry.
        restart_policy="Never",
        termination_grace_period_seconds=grace,
        # resources.max_hours; the launcher's plan lowers it to what the run's earlier tries left
        active_deadline_seconds=max(1, int(spec.resources.max_hours * 3600)),
        subdomain=request.name(),
        service_account_name=k.service_account,
        priority_class_name=k.priority_class or _queued_priority_class(spec, config),
        node_selector=node_selector(spec, config) or None,
        tolerations=_tolerations(spec) or None,
        enable_service_links=False,  # no env var per Service in the namespace
        volumes=[
            k8s.V1Volume(
                name="data", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=k.data_pvc)
            ),
            # Docker's 64 MiB default /dev/shm breaks DataLoader workers and NCCL's shared-memory transport.
            k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory")),
        ],
    )
    return k8s.V1PodTemplateSpec(metadata=k8s.V1ObjectMeta(labels=run_labels(spec, run_key)), spec=pod_spec)


def build_service(spec: JobSpec, run_key: str, *, attempt: int = 1) -> k8s.V1Service:
    """Headless: no virtual IP, only the per-pod DNS records, published before the pods are ready (the
    rendezvous happens before any readiness could be reported)."""
    name = job_name(spec, run_key, attempt=attempt)
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=name, namespace=spec.kubernetes.namespace, labels=run_labels(spec, run_key)),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            selector=run_labels(spec, run_key),
            publish_not_ready_addresses=True,
            ports=[k8s.V1ServicePort(name="rendezvous", port=RDZV_PORT, target_port=RDZV_PORT, protocol="TCP")],
        ),
    )


_ELASTIC_FAILURE_POLICY = k8s.V1PodFailurePolicy(
    rules=[
        k8s.V1PodFailurePolicyRule(
            action="Ignore",
            on_pod_conditions=[k8s.V1PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")],
        )
    ]
)
_ELASTIC_SUCCESS_POLICY = k8s.V1SuccessPolicy(rules=[k8s.V1SuccessPolicyRule(succeeded_indexes="0")])


def build_job(request: PodRequest) -> k8s.V1Job:
    """An Indexed Job, one pod per node, all started together, never retried by the cluster; suspended and
    labelled with the team's queue when Kueue admits the trainings."""
    spec, resources = request.spec, request.fleet()  # read once for the labels and the pod template
    queued = queue_labels(spec, resources)
    return k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=request.metadata({**run_labels(spec, request.run_key), **queued}),
        spec=k8s.V1JobSpec(
            suspend=True if queued else None,  # Kueue unsuspends it once the team's queue admits it
            completion_mode="Indexed",
            completions=spec.resources.nodes,
            parallelism=spec.resources.nodes,
            backoff_limit=0,  # retries are Airflow's: one place decides, and a retry resumes from a checkpoint
            # Elastic: a pod lost with its node (evicted: DisruptionTarget) is no failure of the training, the Job
            # starts it again and it rejoins the nodes that went on without it; rank 0's pod writes the result,
            # so its success is the Job's and ends the other pods (successPolicy: Kubernetes 1.33 and later).
            pod_failure_policy=_ELASTIC_FAILURE_POLICY if spec.resources.elastic else None,
            success_policy=_ELASTIC_SUCCESS_POLICY if spec.resources.elastic else None,
            ttl_seconds_after_finished=JOB_TTL_S,
            template=pod_template(request, resources),
        ),
    )


def build_pod(request: PodRequest) -> k8s.V1Pod:
    """A single-node job as a bare Pod (no Job, no Service), for KubernetesPodOperator."""
    spec = request.spec
    if spec.resources.nodes != 1:
        raise _bad("resources.nodes", f"a single pod runs one node; {spec.resources.nodes} nodes need build_job")
    resources = request.fleet()  # read once for the labels and the pod template
    template = pod_template(request, resources)
    template.spec.subdomain = None
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        # Kueue's pod integration gates a labelled pod until its queue admits it
        metadata=request.metadata({**template.metadata.labels, **queue_labels(spec, resources)}),
        spec=template.spec,
    )


def manifests(request: PodRequest) -> list[dict]:
    """The Service and the Job as plain dicts, in the order they are applied."""
    api = k8s.ApiClient()
    service = build_service(request.spec, request.run_key, attempt=request.attempt)
    return [api.sanitize_for_serialization(service), api.sanitize_for_serialization(build_job(request))]


# -- the launcher seam's Kubernetes implementation ------------------------------------------------------------
POD_CONFIG = "run_config.kubernetes.json"
_URI_PREFIXES = ("sqlite:///", "file://", "")


def in_pod(path: str | Path, home: str | Path) -> str:
    """Where a file under this worker's TRAINYARD_HOME (the shared volume) appears in a pod."""
    try:
        rel = Path(path).resolve().relative_to(Path(home).resolve())
    except ValueError:
        raise PermanentError(
            f"{path} is not under TRAINYARD_HOME ({home}), the volume the pods mount (kubernetes.data_pvc): "
            "the Kubernetes launcher needs the run directory and the prepared data on it"
        ) from None
    return posixpath.join(TRAINYARD_HOME, rel.as_posix()) if rel.parts else TRAINYARD_HOME


def _rewrite(value: Any, home: Path) -> Any:
    """Every path (or sqlite/file URI) under ``home`` in a JSON value, as the pods see it."""
    if isinstance(value, dict):
        return {k: _rewrite(v, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, home) for v in value]
    if isinstance(value, str):
        for prefix in _URI_PREFIXES:  # the plain path last: every string starts with ""
            rest = value[len(prefix) :]
            if value.startswith(prefix) and (rest == str(home) or rest.startswith(f"{home}/")):
                return prefix + in_pod(rest, home)
    return value


def pod_run_config(cfg: RunConfig, home: str | Path) -> RunConfig:
    """The run config with the pods' paths: the same spec, data and run, read through the shared volume.
    Every trainer, built-in or custom, reports through the metrics file in ``work/``, which the platform
    relays to MLflow and TensorBoard when the pods end (``collect_kubernetes``): a pod mounts neither
    store (:func:`run_mounts`), and the config names no tracking URI."""
    raw = cfg.to_json()
    paths = _rewrite({k: v for k, v in raw.items() if k != "spec"}, Path(home).resolve())
    return RunConfig.from_json({**paths, "spec": raw["spec"], "tracking_uri": None})


def running_interval(pods: Iterable[k8s.V1Pod], *, now: float | None = None) -> Interval | None:
    """From the first trainer container's start to the last one's finish (still running: ``now``), as the
    API reports them; time a pod spent pending (queued, pulling) is not in it. None if none started."""
    now = time.time() if now is None else now
    starts, ends = [], []
    for pod in pods:
        for status in (pod.status.container_statuses or []) if pod.status else []:
            state = status.state
            if status.name != CONTAINER or state is None:
                continue
            if state.terminated is not None and state.terminated.started_at is not None:
                starts.append(state.terminated.started_at.timestamp())
                finished = state.terminated.finished_at
                ends.append(finished.timestamp() if finished is not None else now)
            elif state.running is not None and state.running.started_at is not None:
                starts.append(state.running.started_at.timestamp())
                ends.append(now)
    return Interval(min(starts), max(ends)) if starts else None


@dataclass(frozen=True)
class KubernetesPlan:
    """What one try creates: a bare Pod (one node) or an Indexed Job and its headless Service."""

    objects: tuple[k8s.V1Pod] | tuple[k8s.V1Service, k8s.V1Job]
    config_path: str  # the run config as the pods read it
    run_dir: str  # on this worker

    @property
    def names(self) -> list[tuple[str, str]]:
        return [(o.kind, o.metadata.name) for o in self.objects]


class KubernetesLauncher(Launcher):
    """Plan and collect on Kubernetes; launching (create, wait deferred, delete) is the Airflow operator's."""

    where = "kubernetes"

    def __init__(
        self, run_key: str, attempt: int, home: str | Path, *, resources: ResourcesConfig | None = None
    ) -> None:
        self.run_key, self.attempt, self.home, self.resources = run_key, attempt, Path(home), resources

    def plan(self, spec: JobSpec, data: PreparedData, *, run_dir: str, config_path: str) -> KubernetesPlan:
        """Writes the pods' run config next to ``config_path`` (idempotent) and builds the objects; SpecError
        if the team's policy does not allow the namespace, service account, image or env (checked again
        here, where the pods are made)."""
        from trainyard.teams import check_policy

        check_policy(spec, self.resources or resources_in_force())
        cfg = pod_run_config(RunConfig.load(config_path), self.home)
        pod_config = Path(run_dir) / POD_CONFIG
        cfg.dump(pod_config)
        Path(work_dir(run_dir)).mkdir(exist_ok=True)  # where the workers write (on the shared volume)
        config = in_pod(pod_config, self.home)
        data_dir = in_pod(data.path, self.home)
        inputs = [in_pod(p, self.home) for p in recipes.worker_inputs(spec)]
        request = PodRequest(spec, self.run_key, config, self.attempt, self.resources, data_dir, tuple(inputs))
        if spec.resources.nodes == 1:
            objects: Any = (build_pod(request),)
        else:
            objects = (build_service(spec, self.run_key, attempt=self.attempt), build_job(request))
        deadline = max(1, int(time_left(spec, run_dir)))  # the pods stop at what max_hours has left
        for obj in objects:
            if isinstance(obj, k8s.V1Pod):
                obj.spec.active_deadline_seconds = deadline
            elif isinstance(obj, k8s.V1Job):
                obj.spec.template.spec.active_deadline_seconds = deadline
        return KubernetesPlan(objects, config, run_dir)

    def collect(self, plan: KubernetesPlan | None, observed: Iterable[k8s.V1Pod]) -> Interval | None:
        return running_interval(observed)
