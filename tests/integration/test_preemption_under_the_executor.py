"""Preemption under Airflow's real executor: api-server, scheduler, dag-processor and triggerers as processes,
LocalExecutor, two teams' users. A team that lends its idle CPU slot takes it back: the borrower's training
stops at a checkpointed step, its task waits again (not failed, no retry used) and resumes there once the
lender's job has ended. (A file of its own: test_under_the_executor.py's Airflow is the suite's longest
file already, and `make test` runs files side by side.)"""

import re

import pytest
import requests
from dag_helpers import airflow_with_its_config

import checkout

airflow_services = checkout.airflow_services()

pytestmark = pytest.mark.integration
DAG, VISION_DAG = "train_pipeline.default", "train_pipeline.vision"  # tina's team's and alice's


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    af = airflow_with_its_config(tmp_path_factory, airflow_services)
    af.setup(users="admin:admin,tina:user,alice:user")  # tina is of team default, alice of vision
    af.start(teams=("default", "vision"))
    headers = af.headers("admin")
    for dag_id in (DAG, VISION_DAG):
        af.wait(lambda d=dag_id: requests.get(f"{af.url}/api/v2/dags/{d}", headers=headers, timeout=10).ok, 600, dag_id)
    yield af
    af.stop()


def test_a_lender_takes_its_cpu_slot_back_and_the_borrower_resumes_where_it_stopped(airflow):
    """alice's job (team vision, no CPU quota of its own) trains on a CPU slot team default lends; tina
    (team default) asks for both of her team's slots. The ledger preempts alice's training: its workers
    stop at a step with a checkpoint there, its task waits again (not failed, no retry used), tina's job
    trains on the two slots and ends, and alice's resumes at that step and ends with its model."""
    import yaml

    tina, alice = airflow.headers("tina"), airflow.headers("alice")
    resources = airflow.config_dir / "resources.yaml"
    good = resources.read_text()
    edited = yaml.safe_load(good)
    edited["scheduling"]["preemption"]["min_runtime_minutes"] = 0  # at once: the test's minutes are few
    edited["scheduling"]["admission_poll_seconds"] = 2
    resources.write_text(yaml.safe_dump(edited))
    digits = {"recipe": "digits_cnn", "gates": [], "checkpointing": {"every_steps": 50}}
    try:
        borrower = airflow.trigger(
            VISION_DAG,
            {
                **digits,
                "name": "borrows-a-slot",
                "hyperparameters": {"epochs": 120, "batch_size": 16},
                "resources": {"gpus_per_node": 1, "gpu_type": "cpu", "team": "vision"},
            },
            alice,
        )
        run_dir = airflow.trainyard_home / "runs" / "borrows-a-slot"
        airflow.wait(lambda: any(run_dir.glob("**/checkpoints/step-*.pt")), 300, "alice's training to checkpoint")
        lender = airflow.trigger(
            DAG,
            {
                **digits,
                "name": "takes-its-quota-back",
                "hyperparameters": {"epochs": 2},
                "resources": {"gpus_per_node": 2, "gpu_type": "cpu"},
            },
            tina,
        )
        assert airflow.wait_run(DAG, lender, tina, 600)["state"] == "success", airflow.failure_report(DAG, lender, tina)
        ended = airflow.wait_run(VISION_DAG, borrower, alice, 600)
        assert ended["state"] == "success", airflow.failure_report(VISION_DAG, borrower, alice)
    finally:
        resources.write_text(good)
    train = airflow.task_instances(VISION_DAG, borrower, alice)["train"]
    assert train["try_number"] == 1, train  # preempted is not failed: no retry was used
    log = airflow.task_log(VISION_DAG, borrower, "train", alice)
    stopped = re.search(r"preempted: its workers stopped at step (\d+) with a checkpoint there", log)
    assert stopped, log[-4000:]
    assert re.search(rf"resumed from checkpoint \S+ at step {stopped[1]}\b", log), log[-4000:]
    took = airflow.task_log(DAG, lender, "admit", tina)
    assert "reclaiming 1 cpu slot(s) of team default's quota from team vision's job" in took, took[-3000:]
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{airflow.trainyard_home / 'mlflow' / 'mlflow.db'}")
    everywhere = [e.experiment_id for e in mlflow.search_experiments()]
    runs = mlflow.search_runs(everywhere, filter_string="tags.`trainyard.preemptions` = '1'")
    # alice's training run: preempted once, then trained to its end
    assert [r.info.status for r in runs] == ["FINISHED"]
