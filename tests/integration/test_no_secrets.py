"""No secret where it does not belong: a whole training run, with every secret trainyard and Airflow are
configured with in the worker's environment, leaves none of their values in XCom, the task logs, MLflow
(params, tags, the store itself), the run's configs or any other file of trainyard's state but the keys,
Airflow's database or its log files."""

import json
import secrets
from pathlib import Path

import pytest
from dag_helpers import load_dag, xcoms

pytestmark = pytest.mark.integration


def _scan(blob: bytes, values: dict[str, bytes]) -> list[str]:
    return [name for name, value in values.items() if value in blob]


def test_a_whole_run_leaves_no_secret_behind(trainyard_home, small_spec, monkeypatch, capfd, caplog):
    from airflow.configuration import conf

    from trainyard.tracking.mlflow_tracking import client

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

    dr = load_dag("train_pipeline").test(run_conf=small_spec)
    assert dr.state == "success"

    found = {}
    # XCom: every task's return value
    found["XCom"] = _scan(json.dumps(xcoms(dr), default=str).encode(), values)
    # the task logs (dag.test() runs the tasks in this process) and the training workers' output in them
    out, err = capfd.readouterr()
    logs = (out + err + caplog.text).encode()
    assert b"launching:" in logs, "the task logs were not captured: the scan would be vacuous"
    found["task logs"] = _scan(logs, values)
    # MLflow: every run's params and tags, and the registered versions' tags
    c = client()
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert runs
    mlflow_text = json.dumps(
        [{"params": r.data.params, "tags": r.data.tags} for r in runs]
        + [mv.tags for mv in c.search_model_versions("name = 'digits'")]
    ).encode()
    found["MLflow params and tags"] = _scan(mlflow_text, values)
    # every file of trainyard's state (run configs, MLflow's store and artifacts, the audit trail, caches),
    # but the keys, where the signing key belongs
    files = [p for p in trainyard_home.rglob("*") if p.is_file() and "keys" not in p.relative_to(trainyard_home).parts]
    assert any(p.name == "run_config.json" for p in files) and any(p.name == "mlflow.db" for p in files)
    for path in files:
        hits = _scan(path.read_bytes(), values)
        if hits:
            found[str(path.relative_to(trainyard_home))] = hits
    # Airflow's own records of the run (dag_run.conf, rendered fields, XCom rows) and its log files
    db_url = conf.get("database", "sql_alchemy_conn")
    assert db_url.startswith("sqlite:///")
    db = Path(db_url.removeprefix("sqlite:///").split("?")[0])
    found["Airflow database"] = _scan(
        db.read_bytes() + b"".join(p.read_bytes() for p in db.parent.glob(db.name + "-wal")), values
    )
    logs_dir = Path(conf.get("logging", "base_log_folder"))
    for path in logs_dir.rglob("*") if logs_dir.is_dir() else []:
        if path.is_file() and (hits := _scan(path.read_bytes(), values)):
            found[str(path)] = hits
    assert {where: hits for where, hits in found.items() if hits} == {}
    assert _scan((trainyard_home / "keys" / "signing_key.pem").read_bytes(), values) == ["signing key"]
