"""What a training leaves in the curves, through the real launcher and relay: throughput and ETA as
metrics, per-layer histograms of weights and gradients read back with TensorBoard's own reader."""

import pytest

pytestmark = pytest.mark.integration


def test_histograms_and_throughput_reach_tensorboard_and_mlflow(trainyard_home):
    from tensorboard.backend.event_processing.event_accumulator import HISTOGRAMS, EventAccumulator

    from trainyard import pipeline
    from trainyard.tracking import mlflow_tracking as mt

    spec = pipeline.validate_spec(
        {
            "hyperparameters": {"epochs": 2, "batch_size": 32},
            "resources": {"gpus_per_node": 2},
            "tracking": {"log_every_steps": 10, "histogram_every_steps": 20},
        },
        audit=False,
    )
    dataset = pipeline.resolve_dataset(spec)
    pipeline.validate_data(spec, dataset, "test/curves")
    data = pipeline.prepare_data(spec, dataset)
    trained = pipeline.train(spec, dataset, data, "test/curves")

    events = EventAccumulator(trained.tensorboard_dir, size_guidance={HISTOGRAMS: 0})
    events.Reload()
    tags = events.Tags()["histograms"]
    assert "weights/head.3.weight" in tags and "gradients/head.3.weight" in tags, tags
    steps = [h.step for h in events.Histograms("gradients/head.3.weight")]
    # every 20th step, but one set in flight: a set asked for while the last is still being written is skipped
    assert steps[0] == 20 and len(steps) >= 2 and set(steps) <= set(range(20, trained.steps + 1, 20)), steps
    first = events.Histograms("weights/head.3.weight")[0].histogram_value
    assert first.num == 10 * 64 and first.min < 0 < first.max  # every weight of the layer, binned

    c = mt.client()
    run = c.get_run(trained.mlflow_run_id)
    assert run.info.status == "FINISHED"  # MLflow shows the run ended
    # the trainer's own packages recorded beside the worker's: here (one virtual environment) the same set
    from trainyard import environment

    assert run.data.tags[environment.TRAINER_TAG] == run.data.tags[environment.DEPENDENCIES_TAG]
    listed = mt.read_artifact(c, run.info.run_id, environment.TRAINER_ARTIFACT)
    assert listed is not None and "torch==" in listed
    history = c.get_metric_history(trained.mlflow_run_id, "samples_per_second")
    assert history and all(m.value > 0 for m in history)
    eta = sorted(c.get_metric_history(trained.mlflow_run_id, "eta_seconds"), key=lambda m: m.step)
    assert eta[-1].value == 0 and eta[0].value > 0

    # the run's report, stored once the gate has decided: its curves and one page of its facts
    from PIL import Image

    metrics = pipeline.evaluate(spec, trained, data)
    verdict = pipeline.gate(spec, metrics, data, trained)
    report = trainyard_home / "runs" / "digits" / "test_curves" / "report"
    with Image.open(report / "curves.png") as png:
        assert png.format == "PNG" and png.size[1] > 600  # a panel per curve
    page = (report / "report.html").read_text()
    run = c.get_run(trained.mlflow_run_id)
    assert dataset.commit in page and run.data.tags["code_version"] in page
    assert f"{run.data.metrics['val_accuracy']:.6g}" in page and f"{run.data.metrics['run_cost']:.6g}" in page
    assert f"Gate {'passed' if verdict['passed'] else 'FAILED'}" in page and "<td>val_accuracy</td>" in page
    assert {"report/report.html", "report/curves.png"} <= {
        a.path for a in c.list_artifacts(trained.mlflow_run_id, "report")
    }
