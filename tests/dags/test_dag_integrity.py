"""Every DAG file imports cleanly, fast, without heavy libraries or connections at parse time."""

import ast
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((REPO / "dags").glob("*.py"))
HEAVY = [
    "torch",
    "mlflow",
    "great_expectations",
    "onnx",
    "onnxruntime",
    "sklearn",
    "lmdb",
    "pandas",
    "numpy",
    "pycocotools",
    "sacrebleu",
    "lakefs",
    "kubernetes",
    "tensorboard",
]

PROBE = r"""
import json, sys, time
import airflow.sdk  # the DAG's own top-level import; its cost is Airflow's, not the DAG file's
from airflow.models.connection import Connection
from airflow.sdk import Variable
calls = []
Connection.get_connection_from_secrets = classmethod(lambda cls, *a, **k: calls.append("connection"))
Variable.get = staticmethod(lambda *a, **k: calls.append("variable"))
before = set(sys.modules)
from airflow.dag_processing.dagbag import DagBag
# CPU time, not wall time: the cost is the parse's own work, and wall time on a shared machine mostly
# measures the other processes (the same parse took 0.4 s and 1.1 s of wall time, 0.30 s of CPU both times)
t1 = time.process_time()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.process_time() - t1
from airflow.sdk.definitions.xcom_arg import XComArg
def keyed(task):  # the XComs a task's arguments read, other than a return value: [task, from, key, unrolled]
    refs = (r for f in task.template_fields for r in XComArg.iter_xcom_references(getattr(task, f, None)))
    return [[task.task_id, op.task_id, key, bool(getattr(op, "multiple_outputs", False))]
            for op, key in refs if key != "return_value"]
dags = {d: {"owners": [t.owner for t in dag.tasks], "tags": sorted(dag.tags), "doc": bool(dag.doc_md),
            "keyed": [k for t in dag.tasks for k in keyed(t)],
            "retries": {t.task_id: t.retries for t in dag.tasks},
            "pools": {t.task_id: [t.pool, t.pool_slots] for t in dag.tasks},
            "error_mapping": {t.task_id: getattr(t.python_callable, "maps_permanent_errors", False)
                              for t in dag.tasks if hasattr(t, "python_callable")},
            "file": dag.fileloc}
        for d, dag in bag.dags.items()}
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "seconds": seconds,
                  "modules": sorted(set(sys.modules) - before), "dags": dags, "calls": calls}))
"""


# The retraining DAGs come from job files (one DAG each, from one factory file); these tests parse the
# shipped examples. The errors file makes no DAG: it fails to import when a job file is broken.
JOB_EXAMPLES = REPO / "include" / "config" / "retraining"
FACTORY, JOB_ERRORS = "retrain_jobs.py", "retrain_jobs_errors.py"


def _parse(path: Path, jobs: Path = JOB_EXAMPLES) -> dict:
    env = {**os.environ, "TRAINYARD_JOBS_DIR": str(jobs)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=[p for p in DAG_FILES if p.name != JOB_ERRORS], ids=lambda p: p.name)
def parsed(request):
    return request.param, _parse(request.param)


def test_there_are_dags():
    assert DAG_FILES


def test_imports_without_errors(parsed):
    _, info = parsed
    assert info["errors"] == {}
    assert info["dags"], "no DAG found"


def test_one_dag_per_file_named_after_it(parsed):
    path, info = parsed
    if path.name == FACTORY:  # one per job file, named after it
        assert sorted(info["dags"]) == sorted(f"retrain_{p.stem}" for p in JOB_EXAMPLES.glob("*.yaml"))
    else:
        assert list(info["dags"]) == [path.stem]


def test_twenty_job_files_parse_within_the_budget_and_a_broken_one_breaks_no_other_dag(tmp_path):
    """Twenty job files: twenty DAGs from the factory within the parse budget below. Two broken files: the
    other DAGs still load, the factory has no import error, and the errors file has one naming each broken
    file and its bad field."""
    example = next(JOB_EXAMPLES.glob("*.yaml"))
    for i in range(20):
        shutil.copy(example, tmp_path / f"job-{i:02d}.yaml")
    info = _parse(REPO / "dags" / FACTORY, tmp_path)
    assert info["errors"] == {} and len(info["dags"]) == 20
    assert info["seconds"] < 2.0, f"parse of 20 job files took {info['seconds']:.2f}s of CPU"
    assert _parse(REPO / "dags" / JOB_ERRORS, tmp_path)["errors"] == {}

    (tmp_path / "job-03.yaml").write_text('schedule: {cron: "0 1 * * *"}\nhyperparameters: {epochs: 0}\n')
    (tmp_path / "job-07.yaml").write_text('schedule: {cron: "every day"}\n')
    info = _parse(REPO / "dags" / FACTORY, tmp_path)
    assert info["errors"] == {} and len(info["dags"]) == 18 and "retrain_job-03" not in info["dags"]
    errors = _parse(REPO / "dags" / JOB_ERRORS, tmp_path)
    assert errors["dags"] == {} and len(errors["errors"]) == 1
    (message,) = errors["errors"].values()
    assert "2 job file(s)" in message
    assert f"{tmp_path / 'job-03.yaml'}: invalid job file:\n  hyperparameters.epochs:" in message
    assert f"{tmp_path / 'job-07.yaml'}: invalid job file:\n  schedule.cron:" in message


def test_parses_fast_without_heavy_imports(parsed):
    _, info = parsed
    # CPU time, with room for a loaded machine (under 0.5 s quiet, 0.82 s seen beside another test worker): the
    # imports that matter (torch, mlflow: seconds each) are caught by name below.
    assert info["seconds"] < 2.0, f"parse took {info['seconds']:.2f}s of CPU"
    heavy = sorted({m.split(".")[0] for m in info["modules"]} & set(HEAVY))
    assert heavy == [], f"heavy modules imported at parse time: {heavy}"


def test_no_connections_or_variables_at_parse(parsed):
    _, info = parsed
    assert info["calls"] == []


def test_owner_tags_docs_retries(parsed):
    _, info = parsed
    for dag_id, dag in info["dags"].items():
        assert all(o and o != "airflow" for o in dag["owners"]), dag_id
        assert dag["tags"], dag_id
        assert dag["doc"], dag_id
        assert any(r >= 1 for r in dag["retries"].values()), f"{dag_id}: no task retries"


def test_every_pool_exists_in_resources(parsed):
    """Every task's pool is one resources.yaml makes, and asks no more slots than the pool has (a GPU
    type's slots: its GPUs, or GPUs x replicas when time-sliced)."""
    from trainyard.scheduling.resources import load_resources, pools

    _, info = parsed
    sizes = {name: pool["slots"] for name, pool in pools(load_resources()).items()}
    for dag_id, dag in info["dags"].items():
        for task_id, (pool, slots) in dag["pools"].items():
            if pool == "default_pool":
                continue
            assert pool in sizes, f"{dag_id}.{task_id}: pool {pool!r} is not in resources.yaml"
            assert slots <= sizes[pool], f"{dag_id}.{task_id}: {slots} slots > pool size {sizes[pool]}"


def test_top_level_imports_are_light():
    allowed = ("airflow.sdk", "airflow.providers.standard", "trainyard", "__future__", "datetime", "pathlib", "os")
    allowed += ("json", "typing", "logging")
    for path in DAG_FILES:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert mod.startswith(allowed), f"{path.name}: top-level import of {mod}"


def test_a_result_read_by_key_is_unrolled_by_its_task(parsed):
    """A task that reads one key of another's result (``plan["config_path"]``) finds it only where that
    task unrolls its result into an XCom per key (multiple_outputs=True); the others keep one XCom."""
    _, info = parsed
    for dag_id, dag in info["dags"].items():
        missing = [(reader, source, key) for reader, source, key, unrolled in dag["keyed"] if not unrolled]
        assert missing == [], f"{dag_id}: read by key from a task with multiple_outputs=False: {missing}"
    if "train_pipeline" in str(parsed[0]):  # the Kubernetes branch reads its plan's config_path by key
        (dag,) = info["dags"].values()
        assert ["train_kubernetes", "plan_kubernetes", "config_path", True] in dag["keyed"], dag["keyed"]


def test_every_task_maps_permanent_errors_in_one_place(parsed):
    """Each Python task is wrapped by trainyard_airflow.errors.fail_permanently (no try/except per task)."""
    _, info = parsed
    for dag_id, dag in info["dags"].items():
        unwrapped = sorted(t for t, wrapped in dag["error_mapping"].items() if not wrapped)
        assert unwrapped == [], f"{dag_id}: tasks without @fail_permanently: {unwrapped}"


def test_permanent_errors_fail_without_retry_and_others_pass_through():
    from airflow.sdk.exceptions import AirflowFailException

    from trainyard.errors import PermanentError, RetryableError
    from trainyard.spec import SpecError
    from trainyard_airflow.errors import fail_permanently

    @fail_permanently
    def task(error: Exception | None = None, params: dict | None = None) -> str:
        """doc"""
        if error is not None:
            raise error
        return "ok"

    assert task() == "ok" and task.__doc__ == "doc" and task.maps_permanent_errors
    assert list(inspect.signature(task).parameters) == ["error", "params"]  # Airflow injects context by name
    for permanent in (PermanentError("bad input"), SpecError("invalid JobSpec:\n  x: y")):
        with pytest.raises(AirflowFailException, match=str(permanent).splitlines()[0]):
            task(permanent)
    for other in (RetryableError("busy"), OSError("disk")):
        with pytest.raises(type(other)):
            task(other)


def test_params_survive_serialization_and_validate_a_conf():
    """The scheduler and the API server use the serialized DAG: its Params (an input per JobSpec field,
    trainyard.form) must load back, refuse at trigger what a field's schema forbids, naming the field,
    and, sent as the form sends them, read back as the DAG's default JobSpec."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import ParamValidationError
    from airflow.serialization.serialized_objects import DagSerialization

    from trainyard.form import spec_input
    from trainyard.spec import JobSpec

    bag = DagBag(dag_folder=str(REPO / "dags" / "train_pipeline.py"))
    dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["train_pipeline"]))
    form = dag.params.deep_merge({"hyperparameters.epochs": 3, "custom.command": ["python", "x.py"]}).validate()
    assert JobSpec.model_validate(spec_input(form)).hyperparameters.epochs == 3
    assert JobSpec.model_validate(spec_input(dag.params.validate())) == JobSpec()
    with pytest.raises(ParamValidationError, match="param hyperparameters.epochs: 0 is less than the minimum of 1"):
        dag.params.deep_merge({"hyperparameters.epochs": 0}).validate()
    with pytest.raises(ParamValidationError, match="param resources.gpu_type: 'tpu-v9' is not one of"):
        dag.params.deep_merge({"resources.gpu_type": "tpu-v9"}).validate()
    dag.params.deep_merge({"hyperparameters": {"epochs": 3}}).validate()  # a REST section: the spec checks it
    epochs = dag.params.get_param("hyperparameters.epochs")
    assert epochs.description and epochs.schema["section"] == "Training" and epochs.schema["title"] == "Epochs"
    assert "section" not in dag.params.get_param("name").schema  # the first section, open when the form opens


def test_the_jobs_page_names_the_stages_of_tasks_the_pipeline_has():
    """The Jobs page says what a run is doing by its tasks' ids (trainyard.jobs_view.STAGES): each is one
    of the pipeline's, so a renamed task cannot leave a run's stage unsaid."""
    from airflow.dag_processing.dagbag import DagBag

    from trainyard.jobs_view import STAGES

    tasks = set(DagBag(dag_folder=str(REPO / "dags" / "train_pipeline.py")).dags["train_pipeline"].task_ids)
    assert {task for task, _ in STAGES} <= tasks, {task for task, _ in STAGES} - tasks


def test_the_tasks_the_cluster_policy_gives_a_node_s_gpus_are_the_pipeline_s_local_trainings():
    """The cluster policy gives each task of PER_NODE_TASKS its node's GPUs, not the job's: each is one of the
    pipeline's local trainings, in a GPU pool, so a renamed task cannot take all of a job's GPUs per node."""
    from airflow.dag_processing.dagbag import DagBag

    from trainyard.scheduling.resources import POOL_PREFIX
    from trainyard_airflow.policy import PER_NODE_TASKS

    dag = DagBag(dag_folder=str(REPO / "dags" / "train_pipeline.py")).dags["train_pipeline"]
    for task_id in PER_NODE_TASKS:
        assert dag.get_task(task_id).pool.startswith(POOL_PREFIX), task_id
    assert dag.get_task("train_kubernetes").task_id not in PER_NODE_TASKS  # its pods: all of the job's GPUs
