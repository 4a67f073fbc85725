"""Opt-in: KubernetesTrainingJobOperator against a real cluster, a 2-node CPU ddp job of the digits CNN.

Needs (skipped without KUBECONFIG):
- KUBECONFIG: the cluster; TRAINYARD_K8S_IMAGE: an image with trainyard and torch installed;
- TRAINYARD_K8S_SHARED_DIR: a local directory that *is* the data PVC's content (e.g. a kind extraMount
  backing a hostPath PersistentVolume): the test uses it as TRAINYARD_HOME (as a worker that mounts the
  PVC does) and writes the prepared data and the run config there; the operator writes the pods' copy of
  the run config with their paths (/var/trainyard/...);
- optional TRAINYARD_K8S_NAMESPACE (default trainyard) and TRAINYARD_K8S_PVC (default trainyard-data),
  both existing.
"""

import json
import os
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.skipif(
        not os.environ.get("KUBECONFIG"),
        reason="no Kubernetes cluster: set KUBECONFIG (and TRAINYARD_K8S_IMAGE) to run",
    ),
]


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"KUBECONFIG is set but {name} is not; see this module's docstring")
    return value


@pytest.fixture
def cluster_run(monkeypatch):
    from trainyard.data.classification import digits_files
    from trainyard.recipes.digits import prepare_classification
    from trainyard.spec import parse_spec
    from trainyard.training.run_config import RunConfig

    shared = Path(_required("TRAINYARD_K8S_SHARED_DIR")).resolve()
    monkeypatch.setenv("TRAINYARD_HOME", str(shared))
    run_id = uuid.uuid4().hex[:8]
    root = shared / f"e2e-{run_id}"
    for rel, data in digits_files().items():
        (root / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / rel).write_bytes(data)
    prepared = prepare_classification(root / "src", "e" * 64, root / "prep", 0.2, 0)
    spec = {
        "name": "e2e-ddp",
        "backends": {"launcher": "kubernetes"},
        "resources": {"nodes": 2, "gpus_per_node": 1, "gpu_type": "cpu"},
        "hyperparameters": {"epochs": 2, "batch_size": 32},
        "kubernetes": {
            "namespace": os.environ.get("TRAINYARD_K8S_NAMESPACE", "trainyard"),
            "image": _required("TRAINYARD_K8S_IMAGE"),
            "data_pvc": os.environ.get("TRAINYARD_K8S_PVC", "trainyard-data"),
            "tolerations": [],
            "cpu_per_gpu": "1",
            "memory_per_gpu": "1Gi",
            "env": {"LOGLEVEL": "INFO"},  # torchrun's agents log their rendezvous result (group_rank=...)
        },
    }
    (root / "run").mkdir()
    config = RunConfig(spec=parse_spec(spec), data=prepared, out_dir=str(root / "run")).dump(
        root / "run" / "run_config.json"
    )
    return SimpleNamespace(spec=spec, run_key=f"e2e/{run_id}", root=root, config_path=str(config))


def test_two_node_ddp_job_succeeds_and_every_worker_logs_to_the_task(cluster_run, capsys):
    from kubernetes import client, config

    from trainyard.spec import parse_spec
    from trainyard.training import usage
    from trainyard.training.launchers.kubernetes import job_name
    from trainyard_airflow.operators.training import KubernetesTrainingJobOperator

    # Not deferred: no triggerer here (the deferred path is tested against a fake API in tests/unit/plugins).
    op = KubernetesTrainingJobOperator(
        task_id="train",
        spec=cluster_run.spec,
        run_key=cluster_run.run_key,
        config_path=cluster_run.config_path,
        kubernetes_conn_id=None,
        config_file=os.environ["KUBECONFIG"],
        startup_timeout_seconds=300,
        job_poll_interval=5,
        deferrable=False,
    )
    pushed = {}
    ti = SimpleNamespace(
        dag_id="e2e",
        task_id="train",
        map_index=-1,
        try_number=1,
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )
    op.execute({"ti": ti, "run_id": cluster_run.run_key.replace("/", "-"), "dag": SimpleNamespace()})

    out = capsys.readouterr()
    task_log = out.out + out.err
    assert "group_rank=0" in task_log and "group_rank=1" in task_log, task_log[-5000:]
    assert "[rank 0]:[trainer] strategy=ddp world_size=2" in task_log
    result = json.loads((cluster_run.root / "run" / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] > 0
    assert pushed["job_name"] == job_name(parse_spec(cluster_run.spec), cluster_run.run_key)

    core = client.CoreV1Api(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))
    namespace = cluster_run.spec["kubernetes"]["namespace"]
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_service(name=pushed["job_name"], namespace=namespace)
    assert gone.value.status == 404  # the operator removed the Service after reading the logs
    (record,) = usage.tries(cluster_run.root / "run")
    assert record["where"] == "kubernetes" and record["gpus"] == 2 and record["ended"] > record["started"]
