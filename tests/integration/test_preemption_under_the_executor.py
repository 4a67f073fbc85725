"""Preemption under Airflow's real executor: api-server, scheduler, dag-processor and triggerers as processes,
LocalExecutor, two teams' users. A team that lends its idle CPU slot takes it back: the borrower's training
stops at a checkpointed step, its task waits again (not failed, no retry used) and resumes there once the
lender's job has ended. (A file of its own: test_under_the_executor.py's Airflow is the suite's longest
file already, and `make test` runs files side by side.)"""

import os
import re
from datetime import datetime

import pytest
import yaml
from dag_helpers import airflow_with_its_config, wait_for_dags

import checkout

airflow_services = checkout.airflow_services()

pytestmark = pytest.mark.integration
DAG, VISION_DAG = "train_pipeline.default", "train_pipeline.vision"  # tina's team's and alice's
# alice's jobs that tina's job preempts at once: 1 in the suite, 20 for bench/preemption_resume.py (the goal:
# 20 of 20 preempted jobs resume and finish with one model version each)
BORROWERS = int(os.environ.get("TRAINYARD_BENCH_BORROWERS", "1"))


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, request):
    af = airflow_with_its_config(tmp_path_factory, airflow_services)
    resources = af.config_dir / "resources.yaml"
    fleet = yaml.safe_load(resources.read_text())
    # one CPU slot more than alice's jobs take, all team default's: tina asks for every one of them
    fleet["gpu_types"]["cpu"]["count"] = fleet["teams"]["default"]["quota"]["cpu"] = BORROWERS + 1
    resources.write_text(yaml.safe_dump(fleet))
    if BORROWERS > 1:
        # every borrower's training at once, with the lender's tasks beside them; Airflow's database and the
        # ledger in PostgreSQL, as a fleet shared by many would have them (with SQLite, the api-server took
        # over 30 s to create the seventh of 20 runs while the scheduler started the first ones' tasks)
        af.env["AIRFLOW__CORE__PARALLELISM"] = af.env["AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG"] = str(BORROWERS + 8)
        postgres = airflow_services.Postgres().start()
        request.addfinalizer(postgres.stop)  # after Airflow's stop below, and whatever fails before it
        af.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = postgres.url
        af.env["TRAINYARD_DATABASE_URL"] = postgres.database("trainyard")
    af.setup(users="admin:admin,tina:user,alice:user")  # tina is of team default, alice of vision
    af.start(teams=("default", "vision"))
    headers = af.headers("admin")
    wait_for_dags(af, headers, DAG, VISION_DAG)
    yield af
    af.stop()


def test_a_lender_takes_its_cpu_slot_back_and_the_borrower_resumes_where_it_stopped(airflow):
    """alice's job (team vision, no CPU quota of its own) trains on a CPU slot team default lends; tina
    (team default) asks for all of her team's slots. The ledger preempts alice's training: its workers
    stop at a step with a checkpoint there, its task waits again (not failed, no retry used), tina's job
    trains on her slots and ends, and alice's resumes at that step and ends with one model version.
    (``BORROWERS`` of alice's jobs, each on a slot of its own, all preempted by tina's one.)"""
    tina, alice = airflow.headers("tina"), airflow.headers("alice")
    resources = airflow.config_dir / "resources.yaml"
    good = resources.read_text()
    edited = yaml.safe_load(good)
    edited["scheduling"]["preemption"]["min_runtime_minutes"] = 0  # at once: the test's minutes are few
    edited["scheduling"]["admission_poll_seconds"] = 2
    resources.write_text(yaml.safe_dump(edited))
    digits = {"recipe": "digits_cnn", "gates": [], "checkpointing": {"every_steps": 50}}
    names = [f"borrows-a-slot-{i}" if BORROWERS > 1 else "borrows-a-slot" for i in range(BORROWERS)]
    try:
        borrowers = {
            name: airflow.trigger(
                VISION_DAG,
                {
                    **digits,
                    "name": name,
                    "hyperparameters": {"epochs": 120, "batch_size": 16},
                    "resources": {"gpus_per_node": 1, "gpu_type": "cpu", "team": "vision"},
                },
                alice,
            )
            for name in names
        }
        for name in names:
            run_dir = airflow.trainyard_home / "runs" / name
            airflow.wait(
                lambda d=run_dir: any(d.glob("**/checkpoints/step-*.pt")), 300 * BORROWERS, f"{name} to checkpoint"
            )
        lender = airflow.trigger(
            DAG,
            {
                **digits,
                "name": "takes-its-quota-back",
                "hyperparameters": {"epochs": 2},
                "resources": {"gpus_per_node": BORROWERS + 1, "gpu_type": "cpu"},
            },
            tina,
        )
        lent_back = airflow.wait_run(DAG, lender, tina, 600 + 30 * BORROWERS)  # every borrower stops first
        assert lent_back["state"] == "success", airflow.failure_report(DAG, lender, tina)
        for run in borrowers.values():
            ended = airflow.wait_run(VISION_DAG, run, alice, 600 * BORROWERS)
            assert ended["state"] == "success", airflow.failure_report(VISION_DAG, run, alice)
    finally:
        resources.write_text(good)
    took = airflow.task_log(DAG, lender, "admit", tina)
    victims = (
        "team vision's job of 1 cpu slot(s)" if BORROWERS == 1 else f"{BORROWERS} x team vision's job of 1 cpu slot(s)"
    )
    assert f"reclaiming {BORROWERS} cpu slot(s) of team default's quota from {victims};" in took, took[-3000:]
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{airflow.trainyard_home / 'mlflow' / 'mlflow.db'}")
    resumed, steps = [], []
    for name, run in borrowers.items():
        train = airflow.task_instances(VISION_DAG, run, alice)["train"]
        assert train["try_number"] == 1, train  # preempted is not failed: no retry was used
        log = airflow.task_log(VISION_DAG, run, "train", alice)
        stopped = re.search(r"preempted: its workers stopped at step (\d+) with a checkpoint there", log)
        assert stopped, log[-4000:]
        again = re.search(r"resumed from checkpoint \S+ at step (\d+)\b", log)
        assert again and again[1] == stopped[1], log[-4000:]  # not one step trained twice
        assert len(mlflow.search_model_versions(f"name = '{name}'")) == 1, name
        resumed.append(name)
        steps.append(int(stopped[1]))
    everywhere = [e.experiment_id for e in mlflow.search_experiments()]
    runs = mlflow.search_runs(everywhere, filter_string="tags.`trainyard.preemptions` = '1'")
    # alice's training runs: each preempted once, then trained to its end
    assert [r.info.status for r in runs] == ["FINISHED"] * BORROWERS
    lenders = airflow.task_instances(DAG, lender, tina)
    queued = datetime.fromisoformat(lenders["validate_spec"]["queued_when"])
    started = datetime.fromisoformat(lenders["train"]["start_date"])
    print(  # bench/preemption_resume.py's figures
        f"preempted at once and resumed to the end with one model version: {len(resumed)} of {BORROWERS}; "
        f"each resumed at the step it had stopped at (steps {min(steps)} to {max(steps)}); "
        f"the lender's train task started {(started - queued).total_seconds():.1f} s after its first task was queued"
    )
