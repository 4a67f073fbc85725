"""ingest_dataset through Airflow, then train_pipeline from a tag of that dataset in TFRecord."""

from pathlib import Path

import pytest
from dag_helpers import load_dag, task_states

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _folder(tmp_path, corrupt=False):
    from trainyard.data.classification import digits_files

    files = digits_files()
    if corrupt:
        files["images/digits-00007.npy"] = files["images/digits-00007.npy"][:-20]  # truncated array
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    return tmp_path


def test_ingest_then_train_from_a_tag_in_tfrecord(trainyard_home, tmp_path):
    from trainyard.data.store import LocalStore
    from trainyard.tracking.mlflow_tracking import client

    dr = load_dag("ingest_dataset").test(run_conf={"folder": str(_folder(tmp_path / "ds")), "repo": "mnistish"})
    assert dr.state == "success", task_states(dr)
    store = LocalStore(trainyard_home / "datasets")
    commit = store.resolve("mnistish", "main")
    assert store.get_commit("mnistish", commit).metadata["kind"] == "image_classification"
    assert list((trainyard_home / "ingest").rglob("index.html")), "no Data Docs written"
    store.tag("mnistish", "v1", commit)

    spec = {
        "name": "mnistish",
        "dataset": {"repo": "mnistish", "ref": "v1", "source": "none", "format": "tfrecord"},
        "split": {"val_fraction": 0.2, "test_fraction": 0.1, "seed": 5},
        "hyperparameters": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1, "seed": 1},
        "resources": {"gpus_per_node": 1},
        "gates": [{"metric": "val_accuracy", "min": 0.8}],
    }
    dr = load_dag("train_pipeline").test(run_conf=spec)
    assert dr.state == "success", task_states(dr)
    mv = client().get_model_version_by_alias("mnistish", "staging")
    assert mv.tags["dataset.commit"] == commit
    assert "metric.test_accuracy" in mv.tags
    prepared = list((trainyard_home / "cache" / "prepared").glob("*/test.tfrecord"))
    assert len(prepared) == 1
    run = client().get_run(mv.run_id)
    artifacts = {a.path for a in client().list_artifacts(mv.run_id, "data_validation")}
    assert "data_validation/validation.json" in artifacts and "data_validation/data_docs" in artifacts
    assert run.data.tags["dataset.digest"] == mv.tags["dataset.digest"]


def test_corrupt_upload_is_not_committed(trainyard_home, tmp_path):
    from trainyard.data.store import LocalStore

    dr = load_dag("ingest_dataset").test(
        run_conf={"folder": str(_folder(tmp_path / "bad", corrupt=True)), "repo": "bad"}
    )
    states = task_states(dr)
    assert states == {"check_upload": "failed", "commit_upload": "upstream_failed"}
    assert not LocalStore(trainyard_home / "datasets").repo_exists("bad")
