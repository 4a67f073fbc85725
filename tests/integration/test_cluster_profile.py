"""The cluster profile (scripts/cluster.py) under faults and a job stream: PostgreSQL, Redis, an MLflow server
and Airflow with the CeleryExecutor, started once by this module on free loopback ports, with two workers on
the ``gpu`` queue (two GPU hosts) and two on ``cpu``. Its fleet is the small replay's
(``tests/fixtures/replay_fleet.yaml``: the ``cpu`` type the trainings use, and an 8-slot pool where every
team limit binds), and it serves the replay's DAG beside the pipelines (a second DAG bundle).

- A sweep's trials run two at a time, one on each GPU worker, against its study in PostgreSQL; the losers
  are pruned and the best is registered.
- The Celery worker that runs a training is killed with SIGKILL, every process under it too, as when its
  host dies: Airflow fails the try once its heartbeat stops (the profile's 20 s), the retry runs on the
  other GPU worker within 60 s of the death and resumes from the checkpoint on the shared volume; its
  training processes stopped past the heartbeat timeout are no false alarm; PostgreSQL (Airflow's
  metadata, MLflow's store, the ledger) is restarted while the retry trains; the run registers exactly one
  version, and the shared ledger never holds more than the fleet has.
- The scheduler replay at a small size: a stream of jobs from two teams, admitted concurrently by the
  tasks on both ``cpu`` workers and by the triggerer against the one ledger in PostgreSQL. Only invariants
  are asserted, never a utilisation figure (that is ``make bench-scheduler``'s): from Airflow's own task
  records, through ``trainyard report utilisation``, never more slots allocated than exist, no team above
  its quota plus its borrowing limit (for more than a handover's moment); borrowing happened; every job
  finishes; the large job starts within the wait bound; the cost report has the run's GPU time.
- A MIG type runs a job per slice at once: seven one-slice jobs through the replay's DAG, six at a time on
  the host that lists the slices.
- The whole profile stops and starts again (``down``, ``up``): runs, registered versions and a job waiting
  in the ledger for its GPUs are all still there, and the waiting job trains once its GPUs are free.
"""

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import requests
from dag_helpers import grid_order

import checkout
from trainyard.scheduling.ledger_db import DatabaseUnavailable
from trainyard.scheduling.resources import load_resources

REPO = Path(__file__).resolve().parents[2]
airflow_services = checkout.airflow_services()
cluster_profile = checkout.cluster_profile()
scheduler_replay = checkout.scheduler_replay()

pytestmark = pytest.mark.integration
DAG = "train_pipeline.default"  # team default's own (multi-team mode)
# A try whose worker died is failed once the scheduler has not heard from it this long: the profile's own
HEARTBEAT_TIMEOUT_S = cluster_profile.TASK_HEARTBEAT_TIMEOUT_S
RECOVERY_GOAL_S = 60  # from a worker's death to its job training again on another host (issue 43)
FLEET = REPO / "tests" / "fixtures" / "replay_fleet.yaml"
TIME_SCALE = 60  # the replay's: max_wait_minutes is scaled by it
MEDIAN_S = 8
H100_HOST = "worker-h100"
MIG_HOLD_S = 60  # long enough for six to start before the first ends, on a loaded machine too


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="trainyard-cluster-", dir="/tmp"))
    root.chmod(0o755)  # PostgreSQL's own user and the sandbox users reach their folders through it
    ports = {name: airflow_services._free_port() for name in cluster_profile.DEFAULT_PORTS}
    fleet = scheduler_replay.scenario_config(load_resources(FLEET), "trainyard", TIME_SCALE, poll=1.0)
    settings = {
        **airflow_services.QUIETER_FOR_TESTS,
        **scheduler_replay.replay_settings(
            scheduler_replay.write_config(fleet, root / "config"), beside_the_pipelines=True
        ),
    }
    # the two GPU hosts of the `cpu` type on hosts of their own (network namespaces), where this machine allows
    network = _network() if OWN_HOSTS else None
    workers = {
        "worker-cpu": cluster_profile.Worker(2, queues="cpu"),
        "worker-gpu": cluster_profile.Worker(1, gpus=cluster_profile.THIS_MACHINE, own_host=OWN_HOSTS),
    }
    c = cluster_profile.Cluster(root, ports, settings, workers, network)
    try:
        c.up(wait_s=600)
        # a second host of the `cpu` type
        c.start_worker("worker-gpu-b", cluster_profile.Worker(1, gpus="cpu=", own_host=OWN_HOSTS))
        c.start_worker("worker-cpu-b", cluster_profile.Worker(2, queues="cpu"))  # and of everything else
        _start_h100_host(c)
        with pytest.MonkeyPatch.context() as mp:  # this process reads MLflow as the tasks do: the service account
            for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                mp.setenv(name, c.env()[name])
            yield c
    finally:
        c.down(wait_s=5)  # the data is thrown away: no need to wait for a graceful end
        if not os.environ.get("TRAINYARD_KEEP_CLUSTER"):  # kept to look into a failure
            shutil.rmtree(root, ignore_errors=True)


# Root with iproute2: the GPU hosts of the `cpu` type each run in a network namespace of its own
OWN_HOSTS = os.geteuid() == 0 and shutil.which("ip") is not None


def _network():
    """A network of this cluster's own: a bridge and namespaces whose names and addresses no other cluster on
    this machine uses (one left by a killed run is removed first)."""
    tag = f"{os.getpid() % 250 + 1}"
    network = cluster_profile.Network(name=f"ty{tag}", prefix=f"10.213.{tag}")
    network.down()
    return network


def _start_h100_host(cluster) -> None:
    """The one host with H100s (the replay's stand-ins hold up to 8 of them): the other GPU workers serve the
    `cpu` type alone. Four of the job stream's stand-ins start at once (each takes a worker slot until it
    defers): with one, a slow machine started them too far apart for any team to borrow."""
    cluster.start_worker(H100_HOST, cluster_profile.Worker(4, gpus=f"h100-80gb={','.join(map(str, range(8)))}"))


def _ran(cluster, worker: str, run_id: str, task: str, dag: str = DAG) -> bool:
    """Whether ``worker``'s log says it ran ``task`` of ``dag``'s (the pipeline's) run ``run_id``."""
    return f"dag_id={dag}/run_id={run_id}/task_id={task}/" in (cluster.logs / f"{worker}.log").read_text()


def _in_training(p: psutil.Process) -> bool:
    """Whether ``p`` is torchrun or one of its workers."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return any(m in " ".join(p.cmdline()) for m in ("torch.distributed.run", "trainyard.training.entry"))
    return False


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


def _api_with_the_dag(cluster):
    """The cluster's API and an admin's headers, once the pipeline's DAG is served."""
    api = airflow_services.OnCluster(cluster)
    headers = api.headers("admin")
    api.wait(
        lambda: (
            requests.get(f"{api.url}/api/v2/dags/{DAG}", headers=headers, timeout=airflow_services.PATIENT_SECONDS).ok
        ),
        300,
        "the DAG",
    )
    return api, headers


def _shared_ledger(cluster):
    """The cluster's fleet and the admission ledger every host shares (in its PostgreSQL)."""
    from trainyard.scheduling.admission.ledger import Ledger

    fleet = load_resources(cluster.settings["TRAINYARD_CONFIG_DIR"] + "/resources.yaml")
    return fleet, Ledger(cluster.database_url("trainyard"), fleet)


def _digits_job(name: str, epochs: int, min_accuracy: float, gpu_type: str = "cpu") -> dict:
    """A digits training on the fleet's `cpu` type (or ``gpu_type``), one slot, gated on its val accuracy."""
    return {
        "name": name,
        "hyperparameters": {"epochs": epochs, "batch_size": 32, "learning_rate": 0.01, "momentum": 0.9, "seed": 1},
        "resources": {"gpus_per_node": 1, "gpu_type": gpu_type},
        "gates": [{"metric": "val_accuracy", "min": min_accuracy}],
    }


# A sweep whose order is known (grid_order): two good learning rates side by side, one on each GPU host (each
# Celery worker runs one task at a time and prefetches none: acks_late), then a bad one, started once a good
# trial completed, so the median pruner stops it at its first epoch
SWEEP_RATES, SWEEP_SEED = [0.05, 0.1, 1e-05], 5


def test_a_sweep_trains_its_trials_on_both_gpu_hosts_with_its_study_in_postgresql(cluster, monkeypatch):
    """A sweep through the CeleryExecutor: three trials of the digits recipe, two at a time, one on each GPU
    worker. Its study is Optuna's RDB storage in the team's schema of the shared PostgreSQL (no journal file
    on the shared volume); the bad learning rate is pruned at its first reporting point; the best trial
    is registered in the MLflow server with its values. First in the module: both GPU workers are up."""
    import optuna
    from mlflow.tracking import MlflowClient

    from trainyard.sweeps import study as studies

    assert set(grid_order(SWEEP_RATES, SWEEP_SEED, 2)) == {0.05, 0.1}  # the premise of the pruning
    api, headers = _api_with_the_dag(cluster)
    sweep = {
        "name": "cluster-lr",
        "trials": 3,
        "parallelism": 2,
        "sampler": "grid",
        "seed": SWEEP_SEED,
        "pruner": "median",
        "startup_trials": 1,
        "warmup_epochs": 1,
        "parameters": [{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": SWEEP_RATES}],
    }
    run_id = api.trigger(DAG, {**_digits_job("sweep-cluster", epochs=3, min_accuracy=0.5), "sweep": sweep}, headers)
    run = api.wait_run(DAG, run_id, headers, seconds=600)
    assert run["state"] == "success", api.failure_report(DAG, run_id, headers)

    monkeypatch.setenv("TRAINYARD_DATABASE_URL", cluster.database_url("trainyard"))
    try:
        study = optuna.load_study(study_name="cluster-lr", storage=studies.storage("default"))
        trials = study.get_trials(deepcopy=False)
    finally:
        studies._database_storage.cache_clear()  # its engine is this cluster's, which a later test restarts
    assert not list(cluster.trainyard_home.glob("sweeps/*/*.journal"))
    by_rate = {t.params["hyperparameters.learning_rate"]: t for t in trials}
    assert len(trials) == 3 and set(by_rate) == set(SWEEP_RATES), [(t.number, t.state, t.params) for t in trials]
    states = {rate: t.state.name for rate, t in by_rate.items()}
    # the bad rate stops at its first epoch; a good one completes, or is stopped later where it falls below
    # the median of a completed trial at some epoch (the pruner's rule, not a fault)
    assert states[1e-05] == "PRUNED" and max(by_rate[1e-05].intermediate_values) == 1, states
    assert "FAIL" not in states.values() and "COMPLETE" in (states[0.05], states[0.1]), states
    # the trials ran on both GPU hosts
    for worker in ("worker-gpu", "worker-gpu-b"):
        log = (cluster.logs / f"{worker}.log").read_text()
        ran = [line for line in log.splitlines() if f"dag_id={DAG}/" in line and "/task_id=trial.train_trial/" in line]
        assert ran, f"{worker} ran no trial of the sweep:\n{log[-3000:]}"

    best = study.best_trial
    assert best.params["hyperparameters.learning_rate"] in (0.05, 0.1), best.params
    version = MlflowClient(cluster.mlflow_url).get_model_version_by_alias("sweep-cluster", "staging")
    # the tracking server runs MLflow's auth app: nobody reads without a login; Airflow's admin logs in with
    # their Airflow password (told to MLflow at `up`) and reads every team's model
    model = f"{cluster.mlflow_url}/api/2.0/mlflow/registered-models/get?name=sweep-cluster"
    assert requests.get(model, timeout=airflow_services.PATIENT_SECONDS).status_code == 401
    password = json.loads((cluster.airflow_home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    assert requests.get(model, auth=("admin", password), timeout=airflow_services.PATIENT_SECONDS).status_code == 200
    assert version.tags["sweep.trial"] == str(best.number), version.tags
    assert json.loads(version.tags["params"])["learning_rate"] == best.params["hyperparameters.learning_rate"]


def _torchrun_addresses(cluster) -> dict[str, str]:
    """The GPU hosts of the `cpu` type whose torchrun runs now, each with the address it is reached at."""
    found = {}
    for name in ("worker-gpu", "worker-gpu-b"):
        pid = cluster.pid(name)
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(pid).children(True) if pid else []:
                argv = p.cmdline()
                if "torch.distributed.run" in argv:
                    found[name] = next(a.split("=", 1)[1] for a in argv if a.startswith("--local-addr="))
    return found


def test_a_two_node_job_trains_across_two_hosts_and_finishes_without_a_person_when_one_dies(cluster):
    """A 2-node digits job, elastic down to one node, on the two GPU hosts of the `cpu` type, each in a network
    namespace of its own: admitted once for both, node 0 (`train`) serves the c10d rendezvous at its host's
    address and node 1 (`train_node`) joins it from the other's, and both train one model. Node 1's host is
    killed mid-epoch with everything on it: node 0 goes on alone from its checkpoint, with no person and no
    retry of its own, and the run registers one version."""
    if not OWN_HOSTS:
        pytest.skip("hosts of their own need root and iproute2 (network namespaces)")
    from mlflow.tracking import MlflowClient

    api, headers = _api_with_the_dag(cluster)
    job = _digits_job("digits-nodes", epochs=40, min_accuracy=0.5)
    job["resources"].update(nodes=2, min_nodes=1)
    job["distributed"] = {"max_restarts": 2}
    run_id = api.trigger(DAG, job, headers)
    run_dir = cluster.trainyard_home / "runs" / "digits-nodes"
    addresses: dict[str, str] = {}

    def both_train_past_a_checkpoint() -> bool:
        addresses.update(_torchrun_addresses(cluster))
        return len(addresses) == 2 and any(run_dir.glob("*/work/checkpoints/step-*.pt"))

    api.wait(both_train_past_a_checkpoint, 600, "both nodes training past a checkpoint")
    prefix = cluster.network.prefix + "."
    assert len(set(addresses.values())) == 2 and all(a.startswith(prefix) for a in addresses.values()), addresses
    node_1 = next(w for w in addresses if _ran(cluster, w, run_id, "train_node"))
    node_0 = next(w for w in addresses if w != node_1)
    assert _ran(cluster, node_0, run_id, "train")
    killed_at = time.time()
    _kill_host(cluster, node_1)
    try:

        def alone_past_a_new_checkpoint() -> bool:
            return any(c.stat().st_mtime > killed_at for c in run_dir.glob("*/work/checkpoints/step-*.pt"))

        api.wait(alone_past_a_new_checkpoint, 300, "node 0's first checkpoint after node 1's death")
        recovered_s = time.time() - killed_at
        print(f"\nnode 1's host killed: node 0 wrote its next checkpoint alone {recovered_s:.1f} s later")

        def ended() -> bool:
            r = requests.get(
                f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}",
                headers=headers,
                timeout=airflow_services.PATIENT_SECONDS,
            )
            return r.ok and r.json()["state"] in ("success", "failed")

        api.wait(ended, 900, f"run {run_id}")
        run = requests.get(
            f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
        ).json()
        log = api.task_log(DAG, run_id, "train", headers)
        assert run["state"] == "success", f"{log[-4000:]}\n{api.failure_report(DAG, run_id, headers)}"
        assert api.task_instances(DAG, run_id, headers)["train"]["try_number"] == 1  # no retry, no person
        assert "2 -> 1 worker(s)" in log, log[-4000:]  # from the checkpoint, on the node left
        assert recovered_s <= RECOVERY_GOAL_S, f"node 0 trained again {recovered_s:.0f} s after node 1's death"
        versions = MlflowClient(cluster.mlflow_url).search_model_versions("name = 'digits-nodes'")
        assert len(versions) == 1, [(v.version, v.tags) for v in versions]
    finally:  # the host back, for the tests after this one
        inventory = cluster_profile.THIS_MACHINE if node_1 == "worker-gpu" else "cpu="
        cluster.start_worker(node_1, cluster_profile.Worker(1, gpus=inventory, own_host=True))


def test_a_training_whose_worker_host_dies_resumes_on_the_other_through_a_database_restart(cluster):
    from mlflow.tracking import MlflowClient

    api, headers = _api_with_the_dag(cluster)
    run_id = api.trigger(DAG, _digits_job("digits-cluster", epochs=60, min_accuracy=0.5), headers)
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
    died = time.monotonic()
    survivor = {"worker-gpu": "worker-gpu-b", "worker-gpu-b": "worker-gpu"}[first]

    fleet, ledger = _shared_ledger(cluster)
    capacity = fleet.gpu_types["cpu"].slots
    seen: list[int] = []

    def held() -> None:
        with contextlib.suppress(DatabaseUnavailable):  # while the server restarts
            held_now = [e for e in ledger.entries() if e.admitted is not None and e.job.gpu_type == "cpu"]
            seen.append(sum(e.job.slots for e in held_now))

    def retry_trains() -> bool:
        held()
        return _training_worker(cluster) == survivor

    api.wait(retry_trains, 600, f"the retry to train on {survivor}")
    recovered_s = time.monotonic() - died
    print(f"\nworker {first} killed: training again on {survivor} {recovered_s:.1f} s later, from its checkpoint "
          f"(the task heartbeat timeout: {HEARTBEAT_TIMEOUT_S} s)")  # fmt: skip
    assert recovered_s <= RECOVERY_GOAL_S, f"training again {recovered_s:.0f} s after the worker's death"
    # No false alarm: the retry's training processes stopped (SIGSTOP, as a step or a checkpoint that takes
    # longer than the heartbeat timeout) past the timeout are not taken for a dead host: the task's supervisor
    # beats on beside them. Its try is still the second and still running afterwards.
    training = [p for p in psutil.Process(cluster.pid(survivor)).children(True) if _in_training(p)]
    for p in training:
        p.suspend()
    try:
        time.sleep(HEARTBEAT_TIMEOUT_S + 15)
    finally:
        for p in training:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
    paused = api.task_instances(DAG, run_id, headers)["train"]
    assert (paused["state"], paused["try_number"]) == ("running", 2), paused
    # the database every component writes to (Airflow's metadata, MLflow's store, the ledger) restarts
    # under the running retry: its heartbeats, lease renewals and metrics meet a closed server for a while
    restarted = time.time()
    try:
        cluster.stop_postgres()
        time.sleep(2)
    finally:
        cluster.start_postgres()
    down_s = time.time() - restarted
    if _training_worker(cluster) != survivor:  # what the retry did, to tell a short training from a crash
        state = api.task_instances(DAG, run_id, headers)["train"]["state"]
        raise AssertionError(
            f"the retry's training is not running after the restart (its task is {state}; a success: train it "
            f"longer)\n{api.task_log(DAG, run_id, 'train', headers, attempt=2)[-4000:]}"
        )
    seen.clear()  # from here on, what the retry holds (the killed try's lease may have been counted before)

    def ended() -> bool:
        held()
        r = requests.get(
            f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
        )
        return r.ok and r.json()["state"] in ("success", "failed")

    api.wait(ended, 900, f"run {run_id}")
    run = requests.get(
        f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}", headers=headers, timeout=airflow_services.PATIENT_SECONDS
    ).json()
    tries = "\n".join(
        f"--- train, try {n}\n{api.task_log(DAG, run_id, 'train', headers, attempt=n)[-4000:]}" for n in (1, 2)
    )
    restarts = [
        line
        for name in ("scheduler", "dag-processor", "triggerer")
        for line in (cluster.logs / f"{name}.log").read_text().splitlines()
        if line.startswith("[cluster]")
    ]
    why = f"PostgreSQL was down {down_s:.0f} s; {restarts}; killed {killed}\n{tries}\n"
    why += api.failure_report(DAG, run_id, headers)
    assert run["state"] == "success", why
    assert max(seen) <= capacity and 1 in seen, seen  # taken again by the retry, never twice

    train = api.task_instances(DAG, run_id, headers)["train"]
    assert train["try_number"] == 2, train
    second_log = api.task_log(DAG, run_id, "train", headers, attempt=2)
    resumed = [line for line in second_log.splitlines() if "start_step=" in line]
    assert resumed and "start_step=0 " not in resumed[0], resumed  # from the checkpoint, not from scratch
    assert cluster.pid(survivor) is not None and cluster.pid(first) is None

    client = MlflowClient(cluster.mlflow_url)
    versions = client.search_model_versions("name = 'digits-cluster'")
    assert len(versions) == 1, [(v.version, v.tags) for v in versions]
    assert versions[0].tags["trainyard.run_key"] == f"{DAG}/{run_id}"
    assert not [e for e in ledger.entries() if e.job.id == f"{DAG}/{run_id}"]  # released at the end
    usage = [json.loads(line) for line in next(run_dir.glob("*/usage.jsonl")).read_text().splitlines()]
    assert len(usage) >= 1, usage  # the surviving try's GPU time is billed


def test_a_job_stream_admitted_by_two_workers_keeps_every_limit_and_finishes(cluster):
    _start_h100_host(cluster)  # the replay's GPU type (if an earlier test stopped it)
    fleet = load_resources(FLEET)
    trace = scheduler_replay.make_trace(fleet, ["h100-80gb"], window=40, load=1.25, median=MEDIAN_S, seed=3)
    assert len(trace) >= 10, trace
    api = airflow_services.OnCluster(cluster)
    result = scheduler_replay.run_trace(api, "trainyard", trace, ["h100-80gb"], window=40, drain_timeout=600)
    assert result["violations"] == [] and result["submit_errors"] == []
    assert result["runs"] == {"success": len(trace)}, result["runs"]
    # every job started: a wait was measured for each, and none is still waiting
    assert sum(w["jobs"] for w in result["waits"].values()) == len(trace)
    assert result["borrowed_gpu_s"] > 0  # the limits were exercised, not idle
    # the bound: a job that waited max_wait_minutes holds a reservation, the time enough running jobs end
    # by their max_hours (the replay's: twice a job's length), which no job of its team and no borrower
    # may push back; so it starts by then at the latest, plus the platform's latency
    max_wait_s = fleet.scheduling.max_wait_minutes * 60 / TIME_SCALE
    longest_s = max(scheduler_replay.max_hours_of(j) for j in trace) * 3600
    large = result["large_job"]
    assert large["slots"] == 4 and large["wait_s"] is not None, large
    assert large["wait_s"] <= max_wait_s + longest_s + 30, large
    # the cost report reads the same runs' usage records: both teams have GPU-hours
    hours = {line.split()[0]: float(line.split()[4]) for line in result["cost_report"].splitlines()[1:]}
    assert hours["vision"] > 0 and hours["nlp"] > 0, result["cost_report"]
    # the trace's admit tasks ran on both cpu workers (two at a time each), the waiting ones' looks in the
    # triggerer, all against the one ledger
    for worker in ("worker-cpu", "worker-cpu-b"):
        log = (cluster.logs / f"{worker}.log").read_text()
        admits = [line for line in log.splitlines() if "dag_id=scheduler_replay/run_id=j" in line]
        admits = [line for line in admits if "/task_id=admit/" in line]
        assert admits, f"{worker} ran no admission of the trace:\n{log[-3000:]}"


def test_a_mig_type_runs_a_job_per_slice_at_once_and_no_more(cluster):
    """Seven one-slice jobs of the fleet's MIG type (two A100s cut into 3 x 1g.10gb + 2 x 2g.20gb each: six
    1g slices) through the replay's DAG: six hold their slices at once, on the one host whose inventory
    lists them, and the seventh starts once one has ended. (Before slices were counted, the type's pool had 2
    slots: 2 jobs at a time.)"""
    mig_host = "worker-a100-mig"
    cluster.start_worker(
        mig_host, cluster_profile.Worker(3, gpus="a100-mig.1g.10gb=" + ",".join(f"MIG-{i}" for i in range(6)))
    )
    try:
        api = airflow_services.OnCluster(cluster)
        headers = api.headers("admin")
        resources = {"team": "vision", "gpu_type": "a100-mig", "mig_profile": "1g.10gb", "nodes": 1, "gpus_per_node": 1}
        runs = [
            api.trigger(scheduler_replay.DAG, {"resources": resources, "hold_seconds": MIG_HOLD_S}, headers)
            for _ in range(7)
        ]
        spans = []
        for run_id in runs:
            assert api.wait_run(scheduler_replay.DAG, run_id, headers, 600)["state"] == "success", api.failure_report(
                scheduler_replay.DAG, run_id, headers
            )
            train = api.task_instances(scheduler_replay.DAG, run_id, headers)["train"]
            assert (train["pool"], train["pool_slots"], train["queue"]) == (
                "gpu-a100-mig.1g.10gb", 1, "gpu-a100-mig.1g.10gb"
            ), train  # fmt: skip
            assert _ran(cluster, mig_host, run_id, "train", dag=scheduler_replay.DAG), run_id
            spans.append((datetime.fromisoformat(train["start_date"]), datetime.fromisoformat(train["end_date"])))
    finally:
        cluster.kill(mig_host)  # its worker retires its announcement: the next test's hosts are the fixture's
    at_once = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert at_once == 6, sorted(spans)
    last = max(spans)  # the seventh to start: after the first of the others ended
    assert last[0] >= min(e for s, e in spans if (s, e) != last), sorted(spans)


def test_the_whole_profile_restarts_with_its_runs_models_and_queued_jobs(cluster):
    """``down`` then ``up`` (what ``make down-cluster`` and ``make up-cluster`` run): the finished runs and
    registered versions are still there, and a job that was waiting for its GPUs when everything stopped
    waits again in the ledger, in its place, and trains once they are there. The job is an H100 one, and
    the one host with H100s is stopped first: it waits because no live worker serves its type, saying so
    (the other GPU hosts' workers serve the `cpu` type alone). The restart is made longer than a waiting
    job's lease (its ledger row is dropped while the profile is down, as a decision would drop a row that
    lapsed): the restarted triggerer's look queues it again with its first arrival. Once the H100 host
    is back it trains there, and on no other host. Last in this module: the second workers the fixture
    added are not started again by ``up``."""
    from mlflow.tracking import MlflowClient

    from trainyard.scheduling.admission.ledger import WAITING_LEASE_S
    from trainyard.scheduling.admission.policy import WaitReason

    api, headers = _api_with_the_dag(cluster)
    fleet, ledger = _shared_ledger(cluster)
    cluster.kill(H100_HOST)  # its worker retires its announcement as it ends
    assert "h100-80gb" not in (ledger.served() or {"h100-80gb": "not routed"}), ledger.hosts()
    run_id = api.trigger(DAG, _digits_job("digits-restart", epochs=3, min_accuracy=0.3, gpu_type="h100-80gb"), headers)
    key = f"{DAG}/{run_id}"

    def unserved() -> str | None:
        """Why the job waits, where it waits for a worker of its type."""
        verdict = next((v for e, v in ledger.standing() if e.job.id == key and e.admitted is None), None)
        return verdict.message if verdict is not None and verdict.reason is WaitReason.UNSERVED else None

    api.wait(unserved, 300, f"{key} to wait in the ledger for a worker of its type")
    assert "h100-80gb: no live worker serves it (the workers serve ['cpu'])" in unserved(), unserved()
    enqueued = next(e.enqueued for e in ledger.entries() if e.job.id == key)

    def admit_state() -> str | None:
        return api.task_instances(DAG, run_id, headers)["admit"]["state"]

    # deferred: its looks are the triggerer's now (the admit task itself, killed by `down` before it
    # deferred, would fail the run: it is not retried)
    api.wait(lambda: admit_state() == "deferred", 120, f"{key}'s admit task to defer")

    def runs(h: dict) -> dict[str, str]:
        r = requests.get(
            f"{api.url}/api/v2/dags/{DAG}/dagRuns",
            headers=h,
            params={"limit": 100},
            timeout=airflow_services.PATIENT_SECONDS,
        )
        r.raise_for_status()
        return {d["dag_run_id"]: d["state"] for d in r.json()["dag_runs"]}

    def versions() -> set[tuple[str, str, str]]:
        client = MlflowClient(cluster.mlflow_url)
        return {(v.name, v.version, v.run_id) for v in client.search_model_versions("")}

    runs_before, versions_before = runs(headers), versions()
    assert runs_before[run_id] in ("queued", "running"), runs_before

    cluster.down()
    assert all(pid is None for pid in cluster.status().values()), cluster.status()
    down = time.time()
    cluster.start_postgres()  # alone: the waiting row goes as if its lease had lapsed during a long restart
    with ledger.db.transaction() as conn:
        conn.execute("DELETE FROM admission WHERE id = ?", (key,))
    assert not [e for e in ledger.entries() if e.job.id == key]
    cluster.up(wait_s=600)

    headers = api.headers("admin")
    runs_after = runs(headers)
    assert {r: s for r, s in runs_after.items() if r != run_id} == {r: s for r, s in runs_before.items() if r != run_id}
    assert versions() == versions_before
    # the restarted triggerer looks again (a lease from after the restart): the job waits, in its place
    # (its arrival is kept apart from its row and lease), for a worker of its type still
    api.wait(unserved, 300, f"{key} to wait again after the restart")
    waiting = [e for e in ledger.entries() if e.job.id == key]
    assert waiting[0].lease_until >= down + WAITING_LEASE_S and waiting[0].enqueued == enqueued, (waiting, enqueued)
    assert api.task_instances(DAG, run_id, headers)["train"]["state"] in (None, "scheduled", "queued"), (
        api.task_instances(DAG, run_id, headers)["train"]
    )

    _start_h100_host(cluster)
    run = api.wait_run(DAG, run_id, headers, seconds=600)
    assert run["state"] == "success", api.failure_report(DAG, run_id, headers)
    # the Fleet page's hosts: each GPU host's worker with its types and devices, all serving again
    hosts = requests.get(
        f"{api.url}/trainyard/fleet.json", headers=headers, timeout=airflow_services.PATIENT_SECONDS
    ).json()["hosts"]
    serving = {(h["host"], h["gpu_type"]): len(h["devices"]) for h in hosts if h["serving"]}
    assert serving.get((H100_HOST, "h100-80gb")) == 8 and serving.get(("worker-gpu", "cpu")) == 0, hosts
    assert {v[:1] for v in versions() - versions_before} == {("digits-restart",)}
    assert not [e for e in ledger.entries() if e.job.id == key]
    # trained on the H100 host's worker, its own type's devices, and on no other host
    assert _ran(cluster, H100_HOST, run_id, "train"), (cluster.logs / f"{H100_HOST}.log").read_text()[-3000:]
    assert not any(_ran(cluster, w, run_id, "train") for w in ("worker-gpu", "worker-gpu-b", "worker-cpu"))
    train_log = api.task_log(DAG, run_id, "train", headers)
    assert f"holds h100-80gb device(s) ['0'] of host {H100_HOST}" in train_log, train_log[-3000:]
