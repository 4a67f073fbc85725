"""A training run triggered without a note gets its JobSpec's headline as the scheduler starts it."""

from types import SimpleNamespace

from trainyard.form import run_note
from trainyard_airflow.run_notes import on_dag_run_running


def _run(dag_id="train_pipeline", conf=None, note=None):
    return SimpleNamespace(dag_id=dag_id, run_id="manual__1", conf=conf, note=note)


def test_a_run_without_a_note_gets_its_jobs_headline_in_either_conf_shape():
    form = _run(conf={"name": "shapes", "recipe": "centernet_detector", "resources.gpus_per_node": 4})
    on_dag_run_running(form, "started")
    assert form.note == "shapes: centernet_detector on 4 x cpu, team default"
    rest = _run("train_pipeline.vision", {"resources": {"gpu_type": "a100-80gb", "gpus_per_node": 1}})
    on_dag_run_running(rest, "started")
    assert rest.note == "digits: digits_cnn on 1 x a100-80gb, team vision"  # the team's own DAG: its team


def test_a_written_note_another_dag_and_a_refused_conf_are_left_alone():
    written = _run(conf={}, note="tried a smaller batch")
    on_dag_run_running(written, "started")
    assert written.note == "tried a smaller batch"
    other = _run("promote_model", conf={})
    on_dag_run_running(other, "started")
    assert other.note is None
    refused = _run(conf={"hyperparameters": {"epochs": 0}})
    on_dag_run_running(refused, "started")
    assert refused.note is None and run_note("train_pipeline", {"hyperparameters": {"epochs": 0}}) is None
    twice = _run(conf={"resources": {"gpus_per_node": 1}, "resources.gpus_per_node": 2})
    on_dag_run_running(twice, "started")
    assert twice.note is None
