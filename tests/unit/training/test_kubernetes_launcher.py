"""The Kubernetes launcher's manifests, table-driven over nodes x strategies x GPU types, and every one of
them checked against the Kubernetes OpenAPI schema (kubernetes-validate, strict: unknown fields fail)."""

import copy
import json
import re
from datetime import UTC
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from datafiles import prepared_in
from trainyard import TRAINER_IMAGE
from trainyard.spec import JobSpec, SpecError, parse_spec
from trainyard.training import custom
from trainyard.training.launchers import kubernetes as K
from trainyard.training.launchers.base import ELASTIC_LAST_CALL_S

RUN_KEY = "train_pipeline/manual__2026-05-01T10:00:00+00:00"
CONFIG = "/var/trainyard/runs/digits/train_pipeline_manual/run_config.json"
DATA_DIR = "/var/trainyard/cache/prepared/abc"  # the prepared split, as the pods see it
# The oldest Kubernetes release trainyard targets, and the newest schema the installed package has.
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

BASE = {
    "name": "digits",
    "backends": {"launcher": "kubernetes"},
    "resources": {"gpus_per_node": 2, "team": "vision"},
    "kubernetes": {
        "namespace": "trainyard-vision",
        "priority_class": "high",
        "service_account": "trainer",
        "node_selector": {"pool": "training"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 60},
        ],
        "env": {"WANDB_MODE": "offline", "NCCL_DEBUG": "INFO"},
        "data_pvc": "datasets",
    },
}
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
A100_MIG = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG"}  # the shipped a100-mig type's nodes
# name -> (spec overrides, expected GPU resource name or None, expected GPU-type selector)
GPU_TYPES = {
    "cpu": ({"resources": {"gpu_type": "cpu"}}, None, {}),
    "a100": ({"resources": {"gpu_type": "a100-80gb"}}, "nvidia.com/gpu", A100),
    "a100-mig": (
        {"resources": {"gpu_type": "a100-mig", "mig_profile": "1g.10gb"}},
        "nvidia.com/mig-1g.10gb",
        A100_MIG,
    ),
}
BYO = ["python", "train.py", "--node-rank", "$(NODE_RANK)"]
# name -> (spec overrides, expected argv: None = the user's command, else the torchrun strategies' tail)
STRATEGIES = {
    "ddp": ({"distributed": {"strategy": "ddp", "max_restarts": 2}}, "torchrun"),
    "horovod": ({"distributed": {"strategy": "horovod", "max_restarts": 2}}, "torchrun"),
    "deepspeed": ({"distributed": {"strategy": "deepspeed", "max_restarts": 2}}, "torchrun"),
    "custom": ({"recipe": "custom", "custom": {"command": BYO, "image": "registry.example/byo:1"}}, None),
}


@pytest.fixture(autouse=True)
def vision_may_bring_its_own(tmp_path_factory, monkeypatch):
    """The shipped fleet, with team vision allowed its own commands in its own registry's images (the
    launcher checks the team's policy again where it builds the pods)."""
    import shutil

    import yaml

    from trainyard.scheduling.resources import default_config_dir

    config = tmp_path_factory.mktemp("fleet") / "config"
    shutil.copytree(default_config_dir(), config)
    data = yaml.safe_load((config / "resources.yaml").read_text())
    data["teams"]["vision"]["policy"].update(
        custom_commands=True, image_prefixes=["trainyard/trainer:", "registry.example/"]
    )
    (config / "resources.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("TRAINYARD_CONFIG_DIR", str(config))


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def spec_for(*overrides: dict) -> JobSpec:
    """BASE with the overrides merged in, validated: the builders take the typed JobSpec only."""
    out = BASE
    for o in overrides:
        out = merge(out, o)
    return parse_spec(out)


GRID = [
    pytest.param(nodes, strategy, gpu, id=f"{strategy}-{gpu}-{nodes}node")
    for nodes in (1, 2, 3, 4)
    for strategy in STRATEGIES
    for gpu in GPU_TYPES
]


def _env(container: k8s.V1Container) -> dict:
    return {e.name: (e.value if e.value is not None else e.value_from.field_ref.field_path) for e in container.env}


@pytest.mark.parametrize("nodes, strategy, gpu", GRID)
def test_job_for_every_combination(nodes, strategy, gpu):
    gpu_over, gpu_name, gpu_selector = GPU_TYPES[gpu]
    strat_over, launcher_kind = STRATEGIES[strategy]
    spec = spec_for(gpu_over, strat_over, {"resources": {"nodes": nodes}})
    job = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG, data_dir=DATA_DIR))
    name = K.job_name(spec, RUN_KEY)
    labels = K.run_labels(spec, RUN_KEY)

    assert (job.kind, job.api_version, job.metadata.name, job.metadata.namespace) == (
        "Job",
        "batch/v1",
        name,
        "trainyard-vision",
    )
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.parallelism == job.spec.completions == nodes
    assert job.spec.backoff_limit == 0
    assert job.spec.pod_failure_policy is None and job.spec.success_policy is None  # elastic Jobs' only
    assert job.metadata.labels == job.spec.template.metadata.labels == labels
    assert labels["trainyard.io/team"] == "vision" and labels["app.kubernetes.io/name"] == "trainyard"

    pod = job.spec.template.spec
    assert pod.restart_policy == "Never"
    assert pod.subdomain == name
    assert pod.priority_class_name == "high" and pod.service_account_name == "trainer"
    assert pod.node_selector == {**gpu_selector, "pool": "training"}
    assert [(t.key, t.operator, t.value, t.effect, t.toleration_seconds) for t in pod.tolerations] == [
        ("nvidia.com/gpu", "Exists", None, "NoSchedule", None),
        ("spot", "Equal", "true", "NoExecute", 60),
        # a lost node's pod evicted after 30 s, not Kubernetes' 300: its Job fails and the retry resumes
        ("node.kubernetes.io/not-ready", "Exists", None, "NoExecute", 30),
        ("node.kubernetes.io/unreachable", "Exists", None, "NoExecute", 30),
    ]
    volumes = {v.name: v for v in pod.volumes}
    assert volumes["data"].persistent_volume_claim.claim_name == "datasets"
    assert volumes["dshm"].empty_dir.medium == "Memory"

    (c,) = pod.containers
    # its run only: work/ read-write, its config and prepared data read-only, nothing else of the volume
    run = "runs/digits/train_pipeline_manual"
    assert [(m.name, m.mount_path, m.sub_path, m.read_only) for m in c.volume_mounts] == [
        ("data", f"/var/trainyard/{run}/work", f"{run}/work", False),
        ("data", CONFIG, f"{run}/run_config.json", True),
        ("data", DATA_DIR, "cache/prepared/abc", True),
        ("dshm", "/dev/shm", None, None),
    ]
    expected = {"cpu": "8", "memory": "32Gi"}  # 4 CPUs and 16Gi per GPU (default) x 2
    if gpu_name:
        expected[gpu_name] = "2"
    assert c.resources.limits == c.resources.requests == expected
    assert "nvidia.com/gpu" not in expected or gpu_name == "nvidia.com/gpu"

    env = _env(c)
    assert env["TRAINYARD_HOME"] == "/var/trainyard" and env["TRAINYARD_RUN_CONFIG"] == CONFIG
    assert env["WANDB_MODE"] == "offline"
    assert env["TRAINYARD_NODE_INDEX"] == K.INDEX_FIELD
    assert env["OMP_NUM_THREADS"] == "4"
    if gpu_name:
        assert env["NCCL_DEBUG"] == "INFO"  # the user's value wins over the platform's hint
    if strategy == "horovod":
        assert (env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_SIZE"], env["HOROVOD_CROSS_SIZE"]) == (
            str(2 * nodes),
            "2",
            str(nodes),
        )
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(K.HOROVOD_RDZV_PORT)
    else:
        assert not any(k.startswith("HOROVOD_") for k in env)

    pod0 = f"{name}-0.{name}.trainyard-vision.svc.cluster.local"
    if launcher_kind is None:
        assert c.command == BYO and c.image == "registry.example/byo:1"
        assert env["MASTER_ADDR"] == ("localhost" if nodes == 1 else pod0)
        assert (env["MASTER_PORT"], env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == (
            "29400",
            str(nodes),
            "2",
            str(nodes),
        )
        assert env["NODE_RANK"] == env["RANK"] == K.INDEX_FIELD
        run_dir = CONFIG.rsplit("/", 1)[0]
        platform = custom.platform_env(DATA_DIR, run_dir, spec.hyperparameters.model_dump(mode="json"))
        assert {k: env[k] for k in platform} == platform
        assert env["TRAINYARD_OUTPUT_DIR"] == custom.work_dir(run_dir) and env["TRAINYARD_DATA_DIR"] == DATA_DIR
    else:
        assert c.image == TRAINER_IMAGE and c.image_pull_policy == "IfNotPresent"
        assert c.command[:4] == ["torchrun", "--nproc_per_node=2", "--max_restarts=2", "--tee=3"]
        assert c.command[-4:] == ["-m", "trainyard.training.entry", "--config", CONFIG]
        if nodes == 1:
            assert "--standalone" in c.command and "--nnodes=1" in c.command
        else:
            assert f"--nnodes={nodes}" in c.command and "--rdzv_backend=c10d" in c.command
            assert f"--rdzv_endpoint={pod0}:29400" in c.command
            assert f"--rdzv_id={name}" in c.command
            assert not any(a.startswith("--node_rank") for a in c.command)  # c10d assigns ranks


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("nodes, strategy, gpu", GRID)
def test_every_manifest_is_valid_kubernetes(nodes, strategy, gpu, version):
    spec = spec_for(GPU_TYPES[gpu][0], STRATEGIES[strategy][0], {"resources": {"nodes": nodes}})
    manifests = K.manifests(K.PodRequest(spec, RUN_KEY, CONFIG, data_dir=DATA_DIR))
    assert [m["kind"] for m in manifests] == ["Service", "Job"]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_an_elastic_job_goes_on_with_min_nodes_and_is_valid_kubernetes(version):
    """min_nodes < nodes: torchrun's node range, and a round that waits ELASTIC_LAST_CALL_S past min_nodes."""
    spec = spec_for({"resources": {"nodes": 4, "min_nodes": 2}})
    (c,) = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG, data_dir=DATA_DIR)).spec.template.spec.containers
    assert "--nnodes=2:4" in c.command
    job = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG, data_dir=DATA_DIR))
    # a pod evicted with its node is started again (no failure); pod 0's success (rank 0's result) is the Job's
    (rule,) = job.spec.pod_failure_policy.rules
    assert (rule.action, [(c.type, c.status) for c in rule.on_pod_conditions]) == (
        "Ignore",
        [("DisruptionTarget", "True")],
    )
    assert [r.succeeded_indexes for r in job.spec.success_policy.rules] == ["0"]
    conf = f"--rdzv_conf=join_timeout=900,read_timeout=900,last_call_timeout={ELASTIC_LAST_CALL_S}"
    assert conf in c.command
    for manifest in K.manifests(K.PodRequest(spec, RUN_KEY, CONFIG, data_dir=DATA_DIR)):
        kubernetes_validate.validate(manifest, version, strict=True)
    fixed = spec_for({"resources": {"nodes": 4, "min_nodes": 4}})  # as many as nodes: not elastic
    (c,) = K.build_job(K.PodRequest(fixed, RUN_KEY, CONFIG, data_dir=DATA_DIR)).spec.template.spec.containers
    assert "--nnodes=4" in c.command and not any("last_call" in a for a in c.command)


def test_the_validator_would_catch_a_mistake():
    job = K.manifests(K.PodRequest(spec_for(), RUN_KEY, CONFIG))[1]
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 2  # not a field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.33", strict=True)


def test_service_is_headless_and_selects_the_run():
    svc = K.build_service(spec_for({"resources": {"nodes": 2}}), RUN_KEY)
    assert svc.metadata.name == K.job_name(spec_for(), RUN_KEY)
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.selector == K.run_labels(spec_for(), RUN_KEY)
    assert svc.spec.publish_not_ready_addresses is True
    assert [(p.name, p.port) for p in svc.spec.ports] == [("rendezvous", 29400)]


@pytest.mark.parametrize(
    "name, spec_name, run_key, attempt",
    [
        ("plain", "digits", RUN_KEY, 1),
        ("retry", "digits", RUN_KEY, 3),
        ("starts with a digit", "3d-unet", RUN_KEY, 1),
        ("dots and underscores", "my.model_v2", RUN_KEY, 1),
        ("longest name", "a" * 63, RUN_KEY, 999),
        ("trailing dash", "digits-", "x", 1),
    ],
)
def test_job_name_is_dns_safe_short_and_deterministic(name, spec_name, run_key, attempt):
    spec = parse_spec({"name": spec_name})
    got = K.job_name(spec, run_key, attempt=attempt)
    assert DNS_1035.match(got) and len(got) <= K.NAME_MAX, got
    assert got == K.job_name(spec, run_key, attempt=attempt)
    assert got.endswith(f"-{attempt}")
    assert got != K.job_name(spec, run_key + "x", attempt=attempt)
    assert got != K.job_name(spec, run_key, attempt=attempt + 1)


def test_run_labels_are_label_safe():
    labels = K.run_labels(
        parse_spec({"name": "digits-", "resources": {"team": "ml.", "gpu_type": "cpu"}}), "dag/run:+00:00"
    )
    assert labels["trainyard.io/job"] == "digits" and labels["trainyard.io/team"] == "ml"
    assert re.fullmatch(r"[0-9a-f]{16}", labels["trainyard.io/run"])
    assert (
        labels["trainyard.io/run"] != K.run_labels(parse_spec({"name": "digits"}), "dag/run:+00:01")["trainyard.io/run"]
    )


@pytest.mark.parametrize(
    "name, overrides, expected",
    [
        ("cpu pods ask for no GPU", {"resources": {"gpu_type": "cpu", "gpus_per_node": 4}}, None),
        ("whole GPUs", {"resources": {"gpu_type": "h100-80gb", "gpus_per_node": 8}}, ("nvidia.com/gpu", 8)),
        (
            "MIG slices",
            {"resources": {"gpu_type": "a100-mig", "mig_profile": "2g.20gb", "gpus_per_node": 1}},
            ("nvidia.com/mig-2g.20gb", 1),
        ),
    ],
)
def test_gpu_resource(name, overrides, expected):
    assert K.gpu_resource(parse_spec(merge({"name": "x"}, overrides))) == expected


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        (
            "MIG on cpu",
            {"resources": {"gpu_type": "cpu", "mig_profile": "1g.10gb"}},
            "resources.mig_profile",
        ),
        ("bad cpu quantity", {"kubernetes": {"cpu_per_gpu": "four"}}, "kubernetes.cpu_per_gpu"),
        ("bad memory quantity", {"kubernetes": {"memory_per_gpu": "16 GB"}}, "kubernetes.memory_per_gpu"),
        (
            "platform env",
            {"kubernetes": {"env": {"MASTER_ADDR": "evil"}}, "recipe": "custom", "custom": {"command": ["x"]}},
            "kubernetes.env",
        ),
        ("platform env", {"kubernetes": {"env": {"TRAINYARD_HOME": "/tmp"}}}, "kubernetes.env"),
        (
            "toleration typo",
            {"kubernetes": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}},
            "kubernetes.tolerations.0",
        ),
        ("unknown GPU type", {"resources": {"gpu_type": "tpu-v5"}}, "resources.gpu_type"),
    ],
)
def test_errors_name_the_field(name, overrides, field):
    with pytest.raises(SpecError, match=re.escape(field)):
        K.build_job(K.PodRequest(spec_for(overrides), RUN_KEY, CONFIG, data_dir=DATA_DIR))


@pytest.mark.parametrize(
    "cpu, memory, gpus, expected",
    [("500m", "1Gi", 3, ("1500m", "3Gi")), ("1.5", "512Mi", 2, ("3", "1024Mi")), ("4", "16Gi", 8, ("32", "128Gi"))],
)
def test_cpu_and_memory_scale_with_gpus(cpu, memory, gpus, expected):
    spec = spec_for(
        {"resources": {"gpus_per_node": gpus}, "kubernetes": {"cpu_per_gpu": cpu, "memory_per_gpu": memory}}
    )
    limits = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG)).spec.template.spec.containers[0].resources.limits
    assert (limits["cpu"], limits["memory"]) == expected


def test_single_node_pod():
    spec = spec_for({"resources": {"gpu_type": "a100-80gb", "gpus_per_node": 4}})
    pod = K.build_pod(K.PodRequest(spec, RUN_KEY, CONFIG, attempt=2))
    assert pod.metadata.name == K.job_name(spec, RUN_KEY, attempt=2)
    assert pod.spec.subdomain is None and pod.spec.restart_policy == "Never"
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    assert "--standalone" in pod.spec.containers[0].command
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(k8s.ApiClient().sanitize_for_serialization(pod), version, strict=True)
    with pytest.raises(SpecError, match="resources.nodes"):
        K.build_pod(K.PodRequest(spec_for({"resources": {"nodes": 2}}), RUN_KEY, CONFIG))


def test_custom_data_dir_and_attempts_get_their_own_names():
    spec = spec_for(STRATEGIES["custom"][0], {"resources": {"nodes": 2}})
    job = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG, attempt=2, data_dir="/var/trainyard/cache/prepared/abc"))
    env = _env(job.spec.template.spec.containers[0])
    assert env["TRAINYARD_DATA_DIR"] == "/var/trainyard/cache/prepared/abc"
    assert env["MASTER_ADDR"].startswith(K.job_name(spec, RUN_KEY, attempt=2) + "-0.")
    assert job.metadata.name != K.job_name(spec, RUN_KEY, attempt=1)


def test_custom_needs_the_data_dir():
    with pytest.raises(ValueError, match="data_dir"):
        K.build_job(K.PodRequest(spec_for(STRATEGIES["custom"][0]), RUN_KEY, CONFIG))


# -- the launcher seam's Kubernetes implementation: plan on a real shared-volume layout, collect ----------
def _run_dir(config_path: str) -> str:
    return str(Path(config_path).parent)


@pytest.fixture
def worker_home(tmp_path):
    """TRAINYARD_HOME on the worker (the shared volume), with a prepared split and a run config."""
    from trainyard.training.run_config import RunConfig

    home = tmp_path / "home"
    prepared = home / "cache" / "prepared" / "abc"
    prepared.mkdir(parents=True)
    (prepared / "manifest.json").write_text("{}")
    data = prepared_in(prepared)
    run_dir = home / "runs" / "digits" / "run1"
    run_dir.mkdir(parents=True)

    def config(spec: JobSpec):
        cfg = RunConfig(
            spec=spec,
            data=data,
            out_dir=str(run_dir / "work"),
            tracking_uri=f"sqlite:///{home}/mlflow/mlflow.db",
            mlflow_run_id="r1",
            tensorboard_dir=str(home / "tensorboard" / "digits"),
            metrics_file=str(run_dir / "work" / "metrics.jsonl"),
        )
        return cfg, str(cfg.dump(run_dir / "run_config.json"))

    return home, config


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_plan_gives_the_pods_the_shared_volumes_paths(worker_home, nodes, strategy):
    from trainyard.training.run_config import RunConfig

    home, config = worker_home
    spec = spec_for(STRATEGIES[strategy][0], {"resources": {"nodes": nodes}})
    cfg, config_path = config(spec)
    plan = K.KubernetesLauncher(RUN_KEY, 2, home).plan(
        cfg.spec, cfg.data, run_dir=_run_dir(config_path), config_path=config_path
    )

    assert [kind for kind, _ in plan.names] == (["Pod"] if nodes == 1 else ["Service", "Job"])
    assert {name for _, name in plan.names} == {K.job_name(spec, RUN_KEY, attempt=2)}
    pod_config = RunConfig.load(home / "runs" / "digits" / "run1" / K.POD_CONFIG)  # what the pods read
    assert plan.config_path == "/var/trainyard/runs/digits/run1/" + K.POD_CONFIG
    assert pod_config.out_dir == "/var/trainyard/runs/digits/run1/work"
    # every trainer reports through the metrics file in work/, relayed at collect: no tracking store named
    assert pod_config.metrics_file == "/var/trainyard/runs/digits/run1/work/metrics.jsonl"
    assert pod_config.data == cfg.data.model_copy(
        update={
            "path": "/var/trainyard/cache/prepared/abc",
            "train": "/var/trainyard/cache/prepared/abc/train.lmdb",
            "val": "/var/trainyard/cache/prepared/abc/val.lmdb",
        }
    )
    assert pod_config.tracking_uri is None
    assert pod_config.tensorboard_dir == "/var/trainyard/tensorboard/digits"
    assert pod_config.spec == cfg.spec and pod_config.mlflow_run_id == "r1"

    workload = plan.objects[-1]
    pod_spec = workload.spec if nodes == 1 else workload.spec.template.spec
    env = _env(pod_spec.containers[0])
    assert env["TRAINYARD_RUN_CONFIG"] == plan.config_path
    if strategy == "custom":
        # The same variables as locally, pointing at what exists on the volume.
        hyperparameters = cfg.spec.hyperparameters.model_dump(mode="json")
        expected = custom.platform_env(
            "/var/trainyard/cache/prepared/abc", "/var/trainyard/runs/digits/run1", hyperparameters
        )
        assert {k: env[k] for k in expected} == expected
        assert json.loads(env["TRAINYARD_HYPERPARAMETERS"])["epochs"] == cfg.spec.hyperparameters.epochs
        on_worker = home / env["TRAINYARD_DATA_DIR"].removeprefix("/var/trainyard/")
        assert (on_worker / "manifest.json").exists()
    else:
        assert pod_spec.containers[0].command[-2:] == ["--config", plan.config_path]
    api = k8s.ApiClient()
    for obj in plan.objects:
        kubernetes_validate.validate(api.sanitize_for_serialization(obj), K8S_VERSIONS[0], strict=True)


def test_plan_refuses_data_outside_the_shared_volume(worker_home, tmp_path):
    home, config = worker_home
    cfg, config_path = config(spec_for(STRATEGIES["custom"][0]))
    elsewhere = cfg.data.model_copy(update={"path": str(tmp_path / "not-shared")})
    with pytest.raises(K.PermanentError, match="not under TRAINYARD_HOME"):
        run_dir = _run_dir(config_path)
        K.KubernetesLauncher(RUN_KEY, 1, home).plan(cfg.spec, elsewhere, run_dir=run_dir, config_path=config_path)


@pytest.mark.parametrize(
    "path, expected",
    [
        ("runs/x/run_config.json", "/var/trainyard/runs/x/run_config.json"),
        ("", "/var/trainyard"),
        ("cache/a b", "/var/trainyard/cache/a b"),
    ],
)
def test_in_pod(tmp_path, path, expected):
    assert K.in_pod(tmp_path / path, tmp_path) == expected


def _status(name, *, running=None, started=None, finished=None):
    from datetime import datetime

    def at(t):
        return None if t is None else datetime.fromtimestamp(t, tz=UTC)

    state = k8s.V1ContainerState(
        running=k8s.V1ContainerStateRunning(started_at=at(running)) if running is not None else None,
        terminated=k8s.V1ContainerStateTerminated(exit_code=0, started_at=at(started), finished_at=at(finished))
        if started is not None
        else None,
        waiting=k8s.V1ContainerStateWaiting(reason="ContainerCreating")
        if running is None and started is None
        else None,
    )
    return k8s.V1ContainerStatus(name=name, state=state, image="i", image_id="", ready=False, restart_count=0)


def _pod(*statuses):
    return k8s.V1Pod(status=k8s.V1PodStatus(phase="Running", container_statuses=list(statuses)))


@pytest.mark.parametrize(
    "name, pods, expected",
    [
        (
            "never started (queued, pulling)",
            [_pod(_status(K.CONTAINER)), k8s.V1Pod(status=k8s.V1PodStatus(phase="Pending"))],
            None,
        ),
        ("one pod finished", [_pod(_status(K.CONTAINER, started=100, finished=160))], (100, 160)),
        (
            "nodes started apart: first start to last finish",
            [
                _pod(_status(K.CONTAINER, started=100, finished=150)),
                _pod(_status(K.CONTAINER, started=130, finished=170)),
            ],
            (100, 170),
        ),
        ("still running at collection (killed)", [_pod(_status(K.CONTAINER, running=100))], (100, 1000)),
        (
            "sidecars do not count",
            [_pod(_status("istio-proxy", started=10, finished=2000), _status(K.CONTAINER, started=100, finished=160))],
            (100, 160),
        ),
    ],
)
def test_running_interval_counts_only_running_time(name, pods, expected):
    got = K.running_interval(pods, now=1000)
    assert (None if got is None else (got.started, got.ended)) == expected


def test_collect_records_a_try_per_call_with_the_jobs_gpus(tmp_path):
    from trainyard.training import usage

    spec = spec_for({"resources": {"nodes": 2, "gpus_per_node": 4}})
    seam = K.KubernetesLauncher(RUN_KEY, 1, tmp_path)
    seam.record(spec, tmp_path, seam.collect(None, [_pod(_status(K.CONTAINER, started=100, finished=160))]))
    seam.record(spec, tmp_path, seam.collect(None, [_pod(_status(K.CONTAINER, started=200, finished=230))]))
    assert [(t["attempt"], t["gpus"], t["where"]) for t in usage.tries(tmp_path)] == [
        (1, 8, "kubernetes"),
        (2, 8, "kubernetes"),
    ]
    assert usage.gpu_seconds(tmp_path) == (60 + 30) * 8


def test_the_pods_stop_at_what_max_hours_has_left(worker_home):
    from trainyard.training import usage
    from trainyard.training.launchers.base import MaxHoursReached

    home, config = worker_home
    spec = spec_for({"resources": {"max_hours": 2}})
    assert K.build_pod(K.PodRequest(spec, RUN_KEY, CONFIG)).spec.active_deadline_seconds == 7200
    cfg, config_path = config(spec)
    launcher = K.KubernetesLauncher(RUN_KEY, 2, home)
    # a failed try
    usage.record_try(_run_dir(config_path), attempt=1, started=0.0, ended=1800.0, gpus=2, where="kubernetes")
    (pod,) = launcher.plan(cfg.spec, cfg.data, run_dir=_run_dir(config_path), config_path=config_path).objects
    assert pod.spec.active_deadline_seconds == 5400
    usage.record_try(_run_dir(config_path), attempt=2, started=2000.0, ended=7400.0, gpus=2, where="kubernetes")
    with pytest.raises(MaxHoursReached, match="used all 2 hour"):
        launcher.plan(cfg.spec, cfg.data, run_dir=_run_dir(config_path), config_path=config_path)


KUEUE_FLEET = """\
gpu_types:
  cpu: {count: 2, price_per_hour: 0}
  a100-80gb: {count: 8, price_per_hour: 1.8, node_selector: {nvidia.com/gpu.product: A100}}
teams:
  vision: {quota: {a100-80gb: 8, cpu: 2}}
priority_classes: {low: 1, high: 500}
scheduling: {kueue: true}
"""


def test_with_kueue_trainings_queue_suspended_in_the_team_s_namespace():
    from trainyard.scheduling.resources import check_spec, parse_resources
    from trainyard.teams import pod_problems

    fleet = parse_resources(KUEUE_FLEET)
    spec = spec_for(
        {"resources": {"team": "vision", "gpu_type": "a100-80gb", "nodes": 2, "priority": 600}},
        {"kubernetes": {"namespace": "trainyard-vision", "priority_class": None}},  # derived from the priority
    )
    check_spec(spec, fleet)
    job = K.build_job(K.PodRequest(spec, RUN_KEY, CONFIG, resources=fleet))
    assert job.spec.suspend is True
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "trainyard"
    assert job.metadata.labels["kueue.x-k8s.io/priority-class"] == "trainyard-high"
    assert job.spec.template.spec.priority_class_name == "trainyard-high"
    single = spec_for(
        {"resources": {"team": "vision", "gpu_type": "a100-80gb"}}, {"kubernetes": {"namespace": "trainyard-vision"}}
    )
    pod = K.build_pod(K.PodRequest(single, RUN_KEY, CONFIG, resources=fleet))
    assert pod.metadata.labels["kueue.x-k8s.io/queue-name"] == "trainyard"
    api = k8s.ApiClient()
    for obj in (job, pod):
        kubernetes_validate.validate(api.sanitize_for_serialization(obj), "1.33", strict=True)
    # the cluster policy passes the queue's choices: the team's namespace, the class named trainyard-<entry>
    # (this spec's service account, 'trainer', is one the fleet's policy does not list)
    template = k8s.V1Pod(metadata=job.spec.template.metadata, spec=job.spec.template.spec)
    template.metadata.namespace = job.metadata.namespace
    for built in (pod, template):
        assert [p.split(":")[0] for p in pod_problems(built, fleet)] == ["kubernetes.service_account"]
    elsewhere = spec_for(
        {"resources": {"team": "vision", "gpu_type": "a100-80gb"}}, {"kubernetes": {"namespace": "ml"}}
    )
    with pytest.raises(
        SpecError,
        match="kubernetes.namespace: team 'vision'.s trainings queue in Kueue from namespace 'trainyard-vision'",
    ):
        check_spec(elsewhere, fleet)


def test_without_kueue_nothing_is_suspended_or_labelled():
    job = K.build_job(
        K.PodRequest(spec_for({"resources": {"nodes": 2}}, {"kubernetes": {"priority_class": None}}), RUN_KEY, CONFIG)
    )
    assert job.spec.suspend is None and "kueue.x-k8s.io/queue-name" not in job.metadata.labels
    assert job.spec.template.spec.priority_class_name is None  # no PriorityClass the cluster may not have


def test_a_pod_mounts_only_its_run(worker_home):
    """Nothing of TRAINYARD_HOME but the run reaches a pod: no mount at the volume's root, none of the
    keys, ledger, audit trail, MLflow store, dataset store or another run; what it may change is its
    work/ alone. A path that climbs out of the volume is refused."""
    home, config = worker_home
    for extra in ("keys", "scheduling", "audit", "mlflow", "datasets", "runs/other/run9"):
        (home / extra).mkdir(parents=True, exist_ok=True)
    cfg, config_path = config(spec_for(STRATEGIES["custom"][0], {"resources": {"nodes": 2}}))
    plan = K.KubernetesLauncher(RUN_KEY, 1, home).plan(
        cfg.spec, cfg.data, run_dir=_run_dir(config_path), config_path=config_path
    )
    (container,) = plan.objects[-1].spec.template.spec.containers
    data = [m for m in container.volume_mounts if m.name == "data"]
    assert {m.sub_path for m in data} == {
        "runs/digits/run1/work", "runs/digits/run1/" + K.POD_CONFIG, "cache/prepared/abc",
    }  # fmt: skip
    assert [m.sub_path for m in data if not m.read_only] == ["runs/digits/run1/work"]
    assert all(m.mount_path == "/var/trainyard/" + m.sub_path for m in data)
    for bad in ("/var/trainyard", "/var/trainyard/../etc", "/etc/passwd", "runs/x"):
        with pytest.raises(K.PermanentError, match="mounts only single files and folders below"):
            K.run_mounts(CONFIG, data_dir=bad)


def test_a_recipe_s_input_file_is_mounted_read_only(worker_home):
    """resnet's init_weights (under TRAINYARD_HOME/weights) reaches the pods as one read-only file."""
    home, config = worker_home
    weights = home / "weights" / "resnet18.pth"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"w")
    spec = spec_for({"recipe": "resnet_classifier", "recipe_options": {"init_weights": "resnet18.pth"}})
    cfg, config_path = config(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINYARD_HOME", str(home))
        plan = K.KubernetesLauncher(RUN_KEY, 1, home).plan(
            cfg.spec, cfg.data, run_dir=_run_dir(config_path), config_path=config_path
        )
    (container,) = plan.objects[-1].spec.containers
    assert ("/var/trainyard/weights/resnet18.pth", "weights/resnet18.pth", True) in [
        (m.mount_path, m.sub_path, m.read_only) for m in container.volume_mounts
    ]


def test_a_job_that_names_its_own_lost_node_toleration_keeps_it():
    spec = parse_spec(
        {
            "name": "x",
            "kubernetes": {
                "tolerations": [
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 120,
                    }
                ]
            },
        }
    )
    assert [(t.key, t.toleration_seconds) for t in K._tolerations(spec)] == [
        ("node.kubernetes.io/unreachable", 120),
        ("node.kubernetes.io/not-ready", K.NODE_LOST_S),
    ]
    every = parse_spec({"name": "x", "kubernetes": {"tolerations": [{"operator": "Exists"}]}})
    assert [(t.key, t.toleration_seconds) for t in K._tolerations(every)] == [(None, None)]  # nothing cut short
