"""The cluster profile (scripts/cluster.py) under a fault: PostgreSQL, Redis, an MLflow server and Airflow with
the CeleryExecutor, started by this module on free loopback ports, with two workers on the ``gpu`` queue
(two GPU hosts) and one on ``cpu``. The Celery worker that runs a training is killed with SIGKILL, every
process under it too, as when its host dies: Airflow fails the try once its heartbeat stops, the retry runs
on the other GPU worker and resumes from the checkpoint on the shared volume, the run registers exactly one
version, and the shared ledger never holds more than the fleet has.
"""

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil
import pytest
import requests

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


airflow_services = _load("airflow_services", REPO / "bench" / "airflow_services.py")
cluster_profile = _load("cluster_profile", REPO / "scripts" / "cluster.py")

pytestmark = pytest.mark.integration
DAG = "train_pipeline"
# A try whose worker died is failed once the scheduler has not heard from it this long (300 s by default).
HEARTBEAT_TIMEOUT_S = 20


class _Api(airflow_services.Airflow):
    """The REST helpers of the test harness, pointed at the cluster's api-server."""

    def __init__(self, cluster):
        super().__init__(cluster.airflow_home, cluster.trainyard_home)
        self.url, self.cluster = cluster.api_url, cluster

    def logs(self) -> str:
        return self.cluster.log_tails()


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="trainyard-cluster-", dir="/tmp"))
    root.chmod(0o755)  # PostgreSQL's own user and the sandbox users reach their folders through it
    ports = {name: airflow_services._free_port() for name in cluster_profile.DEFAULT_PORTS}
    settings = {
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    }
    c = cluster_profile.Cluster(root, ports, settings)
    try:
        c.up(wait_s=600)
        c.start_worker("worker-gpu-b", "gpu", 1)  # a second GPU host
        yield c
    finally:
        c.down(wait_s=5)  # the data is thrown away: no need to wait for a graceful end
        if not os.environ.get("TRAINYARD_KEEP_CLUSTER"):  # kept to look into a failure
            shutil.rmtree(root, ignore_errors=True)


def _training_worker(cluster) -> str | None:
    """The name of the GPU worker whose processes run the training now, if one does."""
    for name in ("worker-gpu", "worker-gpu-b"):
        pid = cluster.pid(name)
        try:
            if pid and any(
                "torch.distributed.run" in " ".join(p.cmdline()) for p in psutil.Process(pid).children(True)
            ):
                return name
        except psutil.NoSuchProcess:
            continue
    return None


def _kill_host(cluster, name: str) -> list[str]:
    """SIGKILL the worker and every process under it (its task supervisor, the task, torchrun and the
    trainers, which run in sessions of their own): all that dies with a host."""
    pid = cluster.pid(name)
    assert pid is not None, f"{name} is not running"  # psutil.Process(None) would be this process
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.info = {"cmdline": p.cmdline()}
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)
    (cluster.pids / f"{name}.pid").unlink()
    return [f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}" for p in procs if p.info]


def test_a_training_whose_worker_host_dies_resumes_on_the_other_and_registers_once(cluster):
    from mlflow.tracking import MlflowClient

    from trainyard.scheduling.admission import Ledger
    from trainyard.scheduling.resources import parse_resources

    api = _Api(cluster)
    headers = api.headers("admin")
    api.wait(lambda: requests.get(f"{api.url}/api/v2/dags/{DAG}", headers=headers, timeout=10).ok, 300, "the DAG")
    conf = {
        "name": "digits-cluster",
        "hyperparameters": {"epochs": 120, "batch_size": 32, "learning_rate": 0.01, "momentum": 0.9, "seed": 1},
        "resources": {"gpus_per_node": 1, "gpu_type": "cpu"},
        "gates": [{"metric": "val_accuracy", "min": 0.5}],
    }
    run_id = api.trigger(DAG, conf, headers)
    run_dir = cluster.trainyard_home / "runs" / "digits-cluster"

    training_on: list[str] = []

    def trains_past_a_checkpoint() -> bool:
        name = _training_worker(cluster)
        if name is None or not any(run_dir.glob("*/work/checkpoints/step-*.pt")):
            return False
        training_on.append(name)
        return True

    api.wait(trains_past_a_checkpoint, 600, "a checkpoint of the training")
    first = training_on[-1]
    killed = _kill_host(cluster, first)

    fleet = parse_resources((REPO / "include" / "config" / "resources.yaml").read_text())
    ledger = Ledger(cluster.database_url("trainyard"), fleet)
    capacity = fleet.gpu_types["cpu"].slots
    seen: list[int] = []

    def ended() -> bool:
        seen.append(sum(e.job.slots for e in ledger.entries() if e.admitted is not None and e.job.gpu_type == "cpu"))
        r = requests.get(f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=10)
        return r.json()["state"] in ("success", "failed")

    api.wait(ended, 900, f"run {run_id}")
    run = requests.get(f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=10).json()
    tries = "\n".join(
        f"--- train, try {n}\n{api.task_log(DAG, run_id, 'train', headers, attempt=n)[-4000:]}" for n in (1, 2)
    )
    assert run["state"] == "success", f"killed {killed}\n{tries}\n{api.failure_report(DAG, run_id, headers)}"
    assert max(seen) <= capacity, seen

    train = api.task_instances(DAG, run_id, headers)["train"]
    assert train["try_number"] == 2, train
    second_log = api.task_log(DAG, run_id, "train", headers, attempt=2)
    resumed = [line for line in second_log.splitlines() if "start_step=" in line]
    assert resumed and "start_step=0 " not in resumed[0], resumed  # from the checkpoint, not from scratch
    survivor = {"worker-gpu": "worker-gpu-b", "worker-gpu-b": "worker-gpu"}[first]
    assert cluster.pid(survivor) is not None and cluster.pid(first) is None

    client = MlflowClient(cluster.mlflow_url)
    versions = client.search_model_versions("name = 'digits-cluster'")
    assert len(versions) == 1, [(v.version, v.tags) for v in versions]
    assert versions[0].tags["trainyard.run_key"] == f"{DAG}/{run_id}"
    assert not [e for e in ledger.entries() if e.job.id == f"{DAG}/{run_id}"]  # released at the end
    usage = [json.loads(line) for line in next(run_dir.glob("*/usage.jsonl")).read_text().splitlines()]
    assert len(usage) >= 1, usage  # the surviving try's GPU time is billed
