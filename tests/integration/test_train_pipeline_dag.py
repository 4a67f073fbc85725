"""train_pipeline through Airflow (`dag.test()`): real tasks, real torchrun, real MLflow."""

import json
import secrets
import sys
from pathlib import Path

import pytest
from dag_helpers import load_dag, task_states, xcoms

from trainyard.data.prepare import PreparedData

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dag():
    return load_dag("train_pipeline")


def _secrets(trainyard_home: Path, monkeypatch) -> dict[str, bytes]:
    """Every secret trainyard and Airflow are configured with, put in the worker's environment."""
    from airflow.configuration import conf

    pem = (trainyard_home / "keys" / "signing_key.pem").read_bytes()
    values = {
        "signing key": b"".join(pem.splitlines()[1:-1]),  # the key itself, the PEM's base64 body
        "lakeFS secret": secrets.token_hex(16).encode(),
        "AWS secret": secrets.token_hex(16).encode(),
        "Fernet key": conf.get("core", "fernet_key").encode(),
        "JWT secret": conf.get("api_auth", "jwt_secret").encode(),
    }
    assert all(len(v) >= 16 for v in values.values()), "a configured secret is empty: the scan would be vacuous"
    monkeypatch.setenv("TRAINYARD_SIGNING_KEY", pem.decode())  # the register step signs with it from here
    monkeypatch.setenv("LAKEFS_SECRET_ACCESS_KEY", values["lakeFS secret"].decode())
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", values["AWS secret"].decode())
    return values


def _secrets_left_behind(dr, trainyard_home: Path, values: dict[str, bytes], logs: bytes) -> dict[str, list[str]]:
    """Where a secret's value is found: XCom, the task logs, MLflow (params, tags, the store itself), the
    run's configs or any other file of trainyard's state but the keys, Airflow's database or its log files."""
    from airflow.configuration import conf

    from trainyard.tracking.mlflow_tracking import client

    def scan(blob: bytes) -> list[str]:
        return [name for name, value in values.items() if value in blob]

    found = {"XCom": scan(json.dumps(xcoms(dr), default=str).encode())}
    assert b"launching:" in logs, "the task logs were not captured: the scan would be vacuous"
    found["task logs"] = scan(logs)  # dag.test() runs the tasks in this process, with the workers' output
    c = client()
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert runs
    mlflow_text = json.dumps(
        [{"params": r.data.params, "tags": r.data.tags} for r in runs]
        + [mv.tags for mv in c.search_model_versions("name = 'digits'")]
    ).encode()
    found["MLflow params and tags"] = scan(mlflow_text)
    files = [p for p in trainyard_home.rglob("*") if p.is_file() and "keys" not in p.relative_to(trainyard_home).parts]
    assert any(p.name == "run_config.json" for p in files) and any(p.name == "mlflow.db" for p in files)
    for path in files:
        found[str(path.relative_to(trainyard_home))] = scan(path.read_bytes())
    db_url = conf.get("database", "sql_alchemy_conn")
    assert db_url.startswith("sqlite:///")
    db = Path(db_url.removeprefix("sqlite:///").split("?")[0])
    wal = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "-wal"))
    found["Airflow database"] = scan(db.read_bytes() + wal)
    logs_dir = Path(conf.get("logging", "base_log_folder"))
    for path in logs_dir.rglob("*") if logs_dir.is_dir() else []:
        if path.is_file():
            found[str(path)] = scan(path.read_bytes())
    assert scan((trainyard_home / "keys" / "signing_key.pem").read_bytes()) == ["signing key"]
    return {where: hits for where, hits in found.items() if hits}


def test_whole_pipeline_registers_a_model(dag, trainyard_home, small_spec, monkeypatch, capfd, caplog):
    """One whole run, also the proof that it leaves no secret it was configured with anywhere but the keys."""
    from trainyard import paths, pipeline
    from trainyard.spec import JobSpec, Tracking
    from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG, client
    from trainyard.training.loop import window_ends

    configured = _secrets(trainyard_home, monkeypatch)
    dr = dag.test(run_conf=small_spec)
    states = task_states(dr)
    assert dr.state == "success", states
    kubernetes_path = {"plan_kubernetes", "train_kubernetes", "collect_kubernetes"}
    sweep_path = {"plan_sweep", "trial.admit", "trial.train_trial", "close_sweep"}
    other_nodes = {"train_node"}  # one node: no other node's task
    assert {states[t] for t in kubernetes_path | sweep_path | other_nodes} == {"skipped"}, states
    assert {s for t, s in states.items() if t not in kubernetes_path | sweep_path | other_nodes} == {"success"}
    from trainyard.scheduling.admission.ledger import default_ledger

    admitted = xcoms(dr)["admit"]
    assert admitted.startswith("admitted: 2 cpu slot(s) for team default"), admitted
    assert default_ledger().entries() == []  # the training released its admission when it ended

    c = client()
    versions = c.search_model_versions("name = 'digits'")
    assert len(versions) == 1
    mv = c.get_model_version_by_alias("digits", "staging")
    tags = mv.tags
    run_key = f"train_pipeline/{dr.run_id}"
    assert tags[RUN_KEY_TAG] == run_key  # one tag name for the run identity, on the version and the run
    assert c.get_run(mv.run_id).data.tags[RUN_KEY_TAG] == run_key
    assert not {"dag_run_id", "airflow_run_id", "trainyard.dag_run_id"} & set(tags)
    assert len(tags["dataset.commit"]) == 64 and tags["dataset.store"] == "local"
    assert tags["code_version"] != ""
    assert '"epochs": 4' in tags["params"]
    assert float(tags["metric.val_accuracy"]) >= 0.85

    onnx_path = Path(tags["onnx_path"])
    assert onnx_path.is_file() and onnx_path.stat().st_size > 10_000

    # The registered model carries a signature and an input example.
    from mlflow.models import get_model_info

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())  # models:/ URIs resolve through it
    info = get_model_info(mv.source)
    assert info.signature is not None and tuple(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == (
        -1,
        1,
        8,
        8,
    )
    assert info.saved_input_example_info is not None
    # what serving the model needs, named at registration (not inferred), pinned to what produced it
    import mlflow
    import onnx
    import onnxruntime

    from trainyard.registry.versions import storage_uri

    stored = storage_uri(c, "digits", mv.version)
    requirements = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{stored}/requirements.txt"))
    pins = set(requirements.read_text().split())
    assert {f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}"} <= pins, pins

    run = c.get_run(mv.run_id)
    assert run.data.tags["dataset.commit"] == tags["dataset.commit"]
    assert run.data.params["hyperparameters.epochs"] == "4"
    loss = c.get_metric_history(mv.run_id, "train_loss")
    trained = xcoms(dr)["train"]
    per_epoch = trained["steps"] // trained["epochs"]
    # a point per tracking.log_every_steps window (the default here) and per epoch end
    assert [m.step for m in loss] == window_ends(trained["steps"], per_epoch, Tracking().log_every_steps)
    assert loss[-1].value < loss[0].value  # it learned
    assert len(c.get_metric_history(mv.run_id, "train_lr")) == len(loss)
    assert c.get_metric_history(mv.run_id, "val_accuracy")
    assert list((trainyard_home / "tensorboard").rglob("events.out.tfevents.*"))

    # A retry of register for the same DAG run creates no second version.
    x = xcoms(dr)
    spec = JobSpec.model_validate(x["validate_spec"])  # the XCom is JSON; the steps take the model
    pinned = pipeline.pinned_dataset(spec, x["resolve_dataset"])  # the XCom, as the DAG's tasks read it
    trained = pipeline.held_training(spec, run_key, x["train"])
    exported = pipeline.held_export(spec, trained, x["export_onnx"])
    again = pipeline.register(spec, pinned, trained, exported, x["evaluate"], run_key)
    assert again == {**again, "version": int(mv.version), "created": False}
    assert len(c.search_model_versions("name = 'digits'")) == 1

    # prepare_data is cached by (commit, split settings).
    assert pipeline.prepare_data(spec, pinned).cached is True

    # The cost is of the GPU time the launcher recorded for every try (one here).
    assert x["train"]["tries"] == 1 and x["train"]["gpu_seconds"] > 0
    assert x["train"]["gpu_seconds"] == pytest.approx(x["train"]["wall_seconds"] * spec.resources.total_gpus, rel=1e-3)

    # The version is signed, and its staging alias move is in the history ("what was live when").
    from trainyard.registry.signing import trusted_keys
    from trainyard.registry.versions import History, verify_version

    assert verify_version(c, "digits", mv.version, trusted_keys())["manifest_sha256"] == again["manifest_sha256"]
    moves = [e for e in History().entries() if e["model"] == "digits" and e["alias"] == "staging"]
    mover = dr.triggering_user_name or "train_pipeline"  # who triggered the run (dag.test() names one)
    assert [(m["from_version"], m["to_version"], m["user"], m["actor"]) for m in moves] == [
        (None, str(mv.version), mover, mover)
    ]
    from trainyard.audit import AuditLog

    (registered,) = AuditLog().entries("registration")  # the retried register above added no second one
    assert (registered["model"], registered["version"], registered["actor"]) == ("digits", str(mv.version), mover)
    assert registered["manifest_sha256"] == again["manifest_sha256"]

    # Champion/challenger: with this version in production, the same model is measured again through its
    # registered ONNX file on the same val split; a challenger must beat it by the margin.
    import tempfile

    c.set_registered_model_alias("digits", "production", mv.version)
    downloads = trainyard_home / "tmp"  # this test's own: another worker's gate cannot touch it
    downloads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(downloads))
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_accuracy", "margin": 0.0}]})
    tie = pipeline.gate(spec, x["evaluate"], PreparedData.model_validate(x["prepare_data"]))
    assert tie["passed"] and tie["champion_version"] == int(mv.version)
    duel = [r for r in tie["checks"] if r["kind"] == "champion"][0]
    assert duel["champion"] == pytest.approx(x["evaluate"]["val_accuracy"])  # same model, same data
    spec = JobSpec.model_validate({**x["validate_spec"], "champion": [{"metric": "val_accuracy", "margin": 0.05}]})
    lost = pipeline.gate(spec, x["evaluate"], PreparedData.model_validate(x["prepare_data"]))
    assert not lost["passed"] and "val_accuracy" in lost["message"]
    assert list(downloads.glob("champion-*")) == []  # the production model's downloaded copy went with each gate

    out, err = capfd.readouterr()
    assert _secrets_left_behind(dr, trainyard_home, configured, (out + err + caplog.text).encode()) == {}


def test_invalid_spec_fails_first_task_only(dag, trainyard_home):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="hyperparameters.epochs"):  # an input per field, its schema's
        dag.test(run_conf={"hyperparameters.epochs": 0})
    # what only the JobSpec knows (a rule across fields, a recipe's metrics) fails the first task
    dr = dag.test(run_conf={"recipe": "centernet_detector"})
    states = task_states(dr)
    assert dr.state == "failed"
    assert states["validate_spec"] == "failed"
    # close_sweep waits for whatever ends its trials had, and finds no sweep was planned: skipped
    assert states["close_sweep"] == "skipped"
    assert {s for t, s in states.items() if t not in ("validate_spec", "close_sweep")} == {"upstream_failed"}


def test_bad_data_never_reaches_training(dag, trainyard_home):
    from trainyard.data.classification import digits_files
    from trainyard.data.ownership import OWNER_KEY
    from trainyard.data.store import LocalStore

    files = digits_files()
    labels = files["labels.csv"].decode().splitlines()
    labels[5] = labels[5].split(",")[0] + ",42"  # a label out of range
    files["labels.csv"] = ("\n".join(labels) + "\n").encode()
    store = LocalStore(trainyard_home / "datasets")
    store.create_repo("broken", metadata={OWNER_KEY: "default"})  # made by team default
    store.upload_many("broken", "main", files)
    store.commit("broken", "main", "bad labels")

    dr = dag.test(run_conf={"dataset": {"repo": "broken", "ref": "main", "source": "none"}})
    states = task_states(dr)
    assert states["validate_data"] == "failed"
    assert states["prepare_data"] == "upstream_failed" and states["train"] == "upstream_failed"
    assert not (trainyard_home / "cache" / "prepared").exists()


@pytest.mark.sandbox
def test_custom_command_trains_and_registers(dag, trainyard_home):
    """Bring your own training: the platform runs the command under torchrun, as an unprivileged sandbox
    user, with the data, checkpoint, output and metrics locations, logs its metrics, gates on them and
    registers its ONNX model. The same command cannot read the signing key, the Airflow config, MLflow's
    database, the dataset store or another team's run, and sees none of the worker's settings."""
    import json
    import os

    from trainyard.tracking.mlflow_tracking import client

    other_run = trainyard_home / "runs" / "vision-secret-job" / "run1"
    other_run.mkdir(parents=True)
    (other_run / "model.pt").write_text("another team's model")
    forbidden = [
        trainyard_home / "keys" / "signing_key.pem",
        Path(os.environ["AIRFLOW_HOME"]) / "airflow.cfg",
        trainyard_home / "mlflow" / "mlflow.db",
        trainyard_home / "datasets",
        other_run / "model.pt",
    ]
    script = REPO / "tests" / "fixtures" / "custom_probe.py"
    dr = dag.test(
        run_conf={
            "name": "byo",
            "recipe": "custom",
            "custom": {"command": [sys.executable, str(script), *map(str, forbidden)]},
            "gates": [{"metric": "val_accuracy", "min": 0.8}],
        }
    )
    states = task_states(dr)
    assert dr.state == "success", states
    c = client()
    mv = c.get_model_version_by_alias("byo", "staging")
    history = c.get_metric_history(mv.run_id, "val_accuracy")
    assert [m.step for m in history] == [50, 100, 150, 200]
    assert c.get_metric_history(mv.run_id, "workers")[-1].value == 2.0  # both workers joined the rendezvous
    assert float(mv.tags["metric.val_accuracy"]) >= 0.8

    (probe,) = (trainyard_home / "runs" / "byo").glob("*/work/probe.json")
    report = json.loads(probe.read_text())
    assert report["paths"] == {str(p): "PermissionError" for p in forbidden}
    assert report["uid"] != 0
    assert not [k for k in report["env"] if k.startswith(("AIRFLOW", "MLFLOW")) or k == "TRAINYARD_HOME"]
    assert probe.stat().st_uid == os.getuid()  # the work tree is the platform's again


@pytest.mark.sandbox
def test_a_built_in_trainers_workers_run_in_the_sandbox(trainyard_home, small_spec):
    """The platform's own workers are sandboxed too (they decode user data and may load a user's weights):
    every worker process runs as the sandbox user, the config they read names no tracking store, and their
    curves still reach MLflow and TensorBoard, relayed by the task from the metrics file."""
    import os
    import pwd

    import psutil
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainyard import pipeline
    from trainyard.tracking.mlflow_tracking import client
    from trainyard.training.run_config import RunConfig

    spec = pipeline.validate_spec({**small_spec, "hyperparameters": {**small_spec["hyperparameters"], "epochs": 2}})
    dataset = pipeline.resolve_dataset(spec)
    data = pipeline.prepare_data(spec, dataset)
    seen: dict = {}

    def on_line(line: str) -> None:
        if line.startswith("sandbox: running as"):
            seen["uid"] = pwd.getpwnam(line.split()[3]).pw_uid
        if "epoch 1/" in line and "workers" not in seen:  # while they train: who runs the workers
            seen["workers"] = {  # attributes read by process_iter: a process that ends meanwhile is skipped
                p.pid: p.info["uids"].real
                for p in psutil.process_iter(["cmdline", "uids", "name"])
                if "trainyard.training.entry" in (p.info["cmdline"] or [])
                and str(trainyard_home) in " ".join(p.info["cmdline"])  # this run's, not another test's
                and p.info["name"] != "bwrap"  # bubblewrap itself and its reaper (pid 1 of the job's namespace)
            }

    trained = pipeline.train(spec, dataset, data, "sandboxed", pipeline.LocalLaunch(on_line=on_line))
    assert len(seen["workers"]) >= 2 and set(seen["workers"].values()) == {seen["uid"]}, seen
    run_dir = Path(trained.run_dir)
    assert RunConfig.load(run_dir / "run_config.json").tracking_uri is None
    assert trained.model_path and Path(trained.model_path) == run_dir / "work" / "model.pt"
    assert all(p.lstat().st_uid == os.getuid() for p in (run_dir / "work").rglob("*"))  # the platform's again
    losses = client().get_metric_history(trained.mlflow_run_id, "train_loss")
    assert losses and max(m.step for m in losses) == trained.steps
    events = EventAccumulator(trained.tensorboard_dir)
    events.Reload()
    assert events.Scalars("train/loss")[-1].step == trained.steps


def test_kubernetes_launcher_branch_without_a_cluster(dag, trainyard_home, monkeypatch):
    """launcher: kubernetes takes the Kubernetes branch (the local train task is skipped); with no cluster
    configured here the launch itself fails, and nothing is evaluated or registered."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    dr = dag.test(run_conf={"backends": {"launcher": "kubernetes"}, "hyperparameters": {"epochs": 1}})
    states = task_states(dr)
    assert states["train"] == "skipped"
    assert states["plan_kubernetes"] == "success"
    assert states["train_kubernetes"] == "failed"
    assert states["evaluate"] == "upstream_failed" and states["register"] == "upstream_failed"
