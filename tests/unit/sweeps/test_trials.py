"""A trial's life against a real Optuna storage: asked, answered at each epoch's end through the
handshake files, told COMPLETE / PRUNED / FAIL; a killed try's trial failed by the retry; concurrent trial
processes; resume, warm start; the sweep's end. Each test runs against both stores of the studies: the
team's journal file (embedded) and PostgreSQL (the cluster profile; a server this session starts)."""

import json
import multiprocessing
import os
import queue
import signal
import time
from pathlib import Path

import optuna
import pytest

from trainyard.spec import parse_spec
from trainyard.sweeps.study import (
    FAILED_ATTR,
    TRAINED_ATTR,
    GridSpent,
    SweepError,
    close,
    fail_left_running,
    finished_trial,
    lineage,
    open_study,
    warm_start,
)
from trainyard.sweeps.trials import run_trial
from trainyard.teams import NotAllowed
from trainyard.training import handshake


@pytest.fixture(autouse=True, params=["journal", "postgresql"])
def study_store(request, monkeypatch):
    import re

    from trainyard.sweeps import study

    monkeypatch.delenv("TRAINYARD_DATABASE_URL", raising=False)
    if request.param == "postgresql":
        name = "studies_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[-50:]
        monkeypatch.setenv("TRAINYARD_DATABASE_URL", request.getfixturevalue("postgres").database(name))
    yield request.param
    study._database_storage.cache_clear()


RUN = "train_pipeline/manual__1"
DATA = "c" * 64  # the dataset commit


def spec(**sweep):
    return parse_spec(
        {
            "hyperparameters": {"epochs": 3},
            "resources": {"gpus_per_node": 1},
            "sweep": {
                "name": "lr",
                "startup_trials": 1,
                "warmup_epochs": 1,
                "parameters": [{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.001, "high": 1}],
                **sweep,
            },
        }
    )


def worker(curve, checkpoint=True):
    """What a trial's rank 0 does, as the train callable: per epoch, report and obey the answer."""

    def train(trial_spec, key, tags, watcher):
        from trainyard.pipeline import TrainingResult, run_dir

        work = run_dir(trial_spec, key) / "work"
        work.mkdir(parents=True, exist_ok=True)
        if checkpoint:
            (work / "checkpoints").mkdir(exist_ok=True)
        ran = {
            "mlflow_run_id": f"run-of-{key}",
            "run_dir": str(work.parent),
            "tensorboard_dir": str(work.parent / "tensorboard"),
            "wall_seconds": 1.0,
            "gpu_seconds": 1.0,
            "tries": 1,
            "cost": 0.0,
        }
        for epoch, value in enumerate(curve, start=1):
            handshake.report(work, epoch, value)
            if handshake.wait_verdict(work, epoch, timeout_s=30):
                return TrainingResult(**ran)  # pruned: the curves, time and cost only
        model = work / "model.pt"
        model.write_bytes(b"weights")
        metrics = {"val_accuracy": curve[-1], "val_loss": 1 - curve[-1]}
        return TrainingResult(**ran, model_path=str(model), steps=len(curve), final_metrics=metrics)

    return train


def states(study):
    return [t.state.name for t in study.get_trials(deepcopy=False)]


def test_a_losing_trial_is_stopped_at_its_reporting_point_and_its_checkpoints_go(trainyard_home):
    s = spec()
    assert run_trial(s, RUN, 0, worker([0.6, 0.8, 0.9]))["state"] == "complete"
    done = run_trial(s, RUN, 1, worker([0.1, 0.1, 0.1]))
    assert done["state"] == "pruned" and done["pruned_at_epoch"] == 1
    study = open_study(s)
    assert states(study) == ["COMPLETE", "PRUNED"]
    assert study.trials[1].intermediate_values == {1: 0.1}
    work = next((trainyard_home / "runs" / "digits").glob("*trial-1")) / "work"
    assert not (work / "checkpoints").exists()
    assert json.loads((work / handshake.VERDICT).read_text()) == {"epoch": 1, "prune": True}
    # both trials in TensorBoard's HParams view, each in its own run directory (beside its scalars)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    for number, state in ((0, "complete"), (1, "pruned")):
        board = next((trainyard_home / "runs" / "digits").glob(f"*trial-{number}")) / "tensorboard"
        events = EventAccumulator(str(board))
        events.Reload()
        content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
        assert info.hparams["trial_state"].string_value == state
        assert (
            info.hparams["hyperparameters.learning_rate"].number_value
            == study.trials[number].params["hyperparameters.learning_rate"]
        )


def test_a_trial_whose_training_fails_ends_fail_with_the_reason(trainyard_home):
    def broken(*_):
        raise RuntimeError("the workers exited with 17")

    with pytest.raises(RuntimeError):
        run_trial(spec(), RUN, 0, broken)
    (trial,) = open_study(spec()).trials
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs[FAILED_ATTR] == "RuntimeError: the workers exited with 17"


def _killed_try(home: str) -> None:
    os.environ["TRAINYARD_HOME"] = home

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    run_trial(spec(), RUN, 3, die)


def test_a_retry_fails_the_trial_its_killed_try_left_running(trainyard_home):
    child = multiprocessing.get_context("spawn").Process(target=_killed_try, args=(str(trainyard_home),))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    assert states(open_study(spec())) == ["RUNNING"]  # what a journal keeps when its process is killed
    assert run_trial(spec(), RUN, 3, worker([0.5, 0.6, 0.7]))["state"] == "complete"
    first, second = open_study(spec()).trials
    assert (
        first.state == optuna.trial.TrialState.FAIL
        and "try ended without finishing it" in first.user_attrs[FAILED_ATTR]
    )
    assert second.state == optuna.trial.TrialState.COMPLETE


def _one_trial(home: str, slot: int, out) -> None:
    os.environ["TRAINYARD_HOME"] = home
    seeded = spec(sampler="random", seed=0)
    out.put(run_trial(seeded, RUN, slot, worker([0.5, 0.6, 0.7], checkpoint=False))["params"])


def test_concurrent_trial_processes_draw_distinct_values(trainyard_home):
    """Four trial processes at once against one study, their random samplers seeded from one sweep seed:
    one ask at a time, each seeded by the number of trials asked before it, so each draws values of its own
    (two asks at once would count the same trials and draw alike)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_one_trial, args=(str(trainyard_home), i, out)) for i in range(4)]
    try:
        for p in procs:
            p.start()
        drawn = []
        deadline = time.monotonic() + 120
        while len(drawn) < len(procs) and time.monotonic() < deadline:
            try:
                drawn.append(out.get(timeout=1)["hyperparameters.learning_rate"])
            except queue.Empty:  # a process that died says so now, not at the deadline
                assert not [p.exitcode for p in procs if p.exitcode not in (None, 0)], "a trial process failed"
        assert len(drawn) == len(procs), f"{len(drawn)} of {len(procs)} trials drew a point within 120 s"
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    assert len(set(drawn)) == 4 and all(0.001 <= v <= 1 for v in drawn), drawn


def test_a_grid_point_whose_trial_failed_is_trained_again_once(trainyard_home):
    """A grid point whose only trial failed is trained again by the next ask (a killed worker must not cost
    the sweep a point), but only once (a point that fails again stays failed)."""
    grid = spec(
        sampler="grid",
        seed=0,
        trials=4,
        parameters=[{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4]}],
    )

    def broken(*_):
        raise RuntimeError("the worker was killed")

    def lr(trial) -> float:
        return trial.params["hyperparameters.learning_rate"]

    pair = spec(
        name="pair",
        sampler="grid",
        trials=2,
        parameters=[{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [0.1, 0.2]}],
    )
    with pytest.raises(RuntimeError):
        run_trial(pair, RUN, 0, broken)
    # the failed point again, told while the other point is still unasked
    assert run_trial(pair, RUN, 0, worker([0.5, 0.6, 0.7]))["state"] == "complete"
    assert run_trial(pair, RUN, 1, worker([0.5, 0.6, 0.7]))["state"] == "complete"
    done = [lr(t) for t in open_study(pair).trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(open_study(pair).trials) == 3 and sorted(done) == [0.1, 0.2]  # each point trained once

    with pytest.raises(RuntimeError):
        run_trial(grid, RUN, 0, broken)
    (lost,) = open_study(grid).trials
    again = run_trial(grid, RUN, 0, worker([0.5, 0.6, 0.7]))
    assert again["params"]["hyperparameters.learning_rate"] == lr(lost) and again["state"] == "complete"
    with pytest.raises(RuntimeError):
        run_trial(grid, RUN, 1, broken)
    with pytest.raises(RuntimeError):
        run_trial(grid, RUN, 1, broken)  # its point again, failed twice
    twice = open_study(grid).trials[-1]
    run_trial(grid, RUN, 1, worker([0.5, 0.6, 0.7]))
    trials = open_study(grid).trials
    assert lr(trials[-1]) not in (lr(lost), lr(twice))
    assert sorted(lr(t) for t in trials if t.state == optuna.trial.TrialState.COMPLETE) == sorted(
        {lr(lost), lr(trials[-1])}
    )


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_seeded_sweep_draws_new_values_for_each_trial_and_the_same_ones_again(trainyard_home, sampler):
    """Each trial task makes its own sampler: seeded alike for every ask, a random draw (the random
    sampler, TPE's startup trials) would give every trial the same values. The sweep's seed still fixes the
    sequence: a second study of the same seed draws the same values in the same order."""

    def drawn(name: str) -> list[float]:
        s = spec(name=name, sampler=sampler, seed=7, startup_trials=4)
        return [
            run_trial(s, RUN, i, worker([0.5, 0.6, 0.7]))["params"]["hyperparameters.learning_rate"] for i in range(4)
        ]

    first = drawn("seeded")
    assert len(set(first)) == 4, first
    assert drawn("seeded-again") == first


def test_a_resumed_grid_sweep_plans_the_points_it_has_left(trainyard_home):
    from trainyard.pipeline import plan_sweep

    grid = spec(
        sampler="grid",
        trials=3,
        parameters=[{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4]}],
    )
    assert plan_sweep(grid) == [0, 1, 2]

    def broken(*_):
        raise RuntimeError("the worker was killed")

    run_trial(grid, RUN, 0, worker([0.5, 0.6, 0.7]))
    with pytest.raises(RuntimeError):
        run_trial(grid, RUN, 1, broken)  # its point is trained again
    assert plan_sweep(grid) == [0, 1, 2]  # 4 points, 1 trained: 3 left
    run_trial(grid, RUN, 1, worker([0.5, 0.6, 0.7]))
    run_trial(grid, RUN, 2, worker([0.5, 0.6, 0.7]))
    assert plan_sweep(grid) == [0]
    run_trial(grid, RUN, 0, worker([0.5, 0.6, 0.7]))
    with pytest.raises(SweepError, match="every point of the grid of sweep 'lr' has been taken"):
        plan_sweep(grid)


def test_a_grid_counts_the_points_its_study_took_under_another_sampler_or_seed(trainyard_home):
    from trainyard.pipeline import plan_sweep

    rates = [{"name": "hyperparameters.learning_rate", "type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4]}]
    taken = run_trial(spec(sampler="random", seed=3, parameters=rates), RUN, 0, worker([0.5, 0.6, 0.7]))
    run_trial(spec(sampler="grid", seed=1, trials=1, parameters=rates), RUN, 1, worker([0.5, 0.6, 0.7]))
    resumed = spec(sampler="grid", seed=2, parameters=rates)  # another seed: another order, the same grid
    assert plan_sweep(resumed) == [0, 1]
    drawn = [run_trial(resumed, RUN, slot, worker([0.5, 0.6, 0.7]))["params"] for slot in (2, 3)]
    rates_trained = [t.params["hyperparameters.learning_rate"] for t in open_study(resumed).trials]
    assert sorted(rates_trained) == [0.1, 0.2, 0.3, 0.4], (taken, drawn)
    with pytest.raises(GridSpent, match="every point of its grid is taken"):  # a slot too many
        run_trial(resumed, RUN, 4, worker([0.5, 0.6, 0.7]))
    assert len(open_study(resumed).trials) == 4

    # a new grid sweep warm-started from this one: the copies guide nothing and count as no point trained
    warm = spec(name="lr-warm", sampler="grid", seed=2, parameters=rates, warm_start_from="lr")
    study = open_study(warm)
    assert warm_start(warm, study) == 4
    assert plan_sweep(warm) == [0, 1, 2, 3]


def test_a_sweep_resumes_its_study_and_a_new_one_starts_warm(trainyard_home):
    s = spec()
    run_trial(s, RUN, 0, worker([0.5, 0.6, 0.7]))
    run_trial(s, "train_pipeline/manual__2", 0, worker([0.5, 0.6, 0.8]))  # a second run, the same sweep
    assert len(open_study(s).trials) == 2
    with pytest.raises(SweepError, match="optimises maximize val_accuracy; this spec asks to minimize"):
        open_study(spec(direction="minimize"))

    narrower = spec(
        name="lr-2",
        warm_start_from="lr",
        parameters=[{"name": "hyperparameters.learning_rate", "type": "float", "low": 0.001, "high": 0.5}],
    )
    fresh = open_study(narrower)
    values = [t.params["hyperparameters.learning_rate"] for t in open_study(s).trials]
    assert warm_start(narrower, fresh) == sum(v <= 0.5 for v in values)  # only what lies in its space
    assert warm_start(narrower, fresh) == 0  # a study with trials is not seeded again
    with pytest.raises(SweepError, match="has no sweep 'nope'"):
        warm_start(spec(name="lr-3", warm_start_from="nope"), open_study(spec(name="lr-3")))


def test_the_end_fails_what_was_left_running_and_picks_the_best_within_the_constraints(trainyard_home):
    from mlflow.tracking import MlflowClient

    from trainyard import paths

    s = spec(constraints=[{"metric": "val_loss", "max": 0.25}])
    run_trial(s, RUN, 0, worker([0.5, 0.7, 0.7]), of_lineage=lineage(s, DATA))  # val_loss 0.3: misses it
    run_trial(s, RUN, 1, worker([0.6, 0.75, 0.8]), of_lineage=lineage(s, DATA))
    open_study(s).ask().set_user_attr("sweep_run", RUN)  # a trial whose task process is gone
    best = close(s, DATA, RUN)
    assert best["trial"] == 1 and best["value"] == 0.8 and best["states"] == {"complete": 2, "fail": 1}
    # the later steps read the trial close chose for this run from the study (no XCom): its spec and result
    trial_spec, trained = finished_trial(s, RUN)
    assert trial_spec.hyperparameters.learning_rate == best["params"]["hyperparameters.learning_rate"]
    assert trained == best["trained"] and trial_spec.sweep is None
    another_job = parse_spec({**s.model_dump(mode="json"), "name": "other"})  # the same team's study of that name
    for job, run in ((s, "train_pipeline/another-run"), (another_job, RUN)):
        with pytest.raises(NotAllowed, match=f"sweep 'lr' of team default chose no trial of job '{job.name}' in run"):
            finished_trial(job, run)
    assert (best["trained"].sweep, best["trained"].sweep_trial, best["trained"].final_metrics["val_accuracy"]) == (
        "lr",
        1,
        0.8,
    )
    c = MlflowClient(paths.mlflow_tracking_uri())
    run = c.get_run(best["summary_run_id"])
    assert run.data.tags["sweep.best_trial"] == "1" and run.data.metrics["trials_complete"] == 2
    files = {Path(a.path).name for a in c.list_artifacts(run.info.run_id, "sweep")}
    assert files == {"trials.csv", "parallel_coordinates.png"}


def test_a_resumed_sweep_on_other_data_never_picks_a_trial_of_the_old(trainyard_home):
    s = spec(pruner="none")
    run_trial(s, RUN, 0, worker([0.6, 0.8, 0.95]), of_lineage=lineage(s, DATA))
    other = "d" * 64
    run_trial(s, "train_pipeline/manual__2", 0, worker([0.6, 0.7, 0.9]), of_lineage=lineage(s, other))
    assert close(s, other, "train_pipeline/manual__2")["value"] == 0.9  # not the 0.95 trained on other data
    hp = s.hyperparameters
    swept = s.model_copy(update={"hyperparameters": hp.model_copy(update={"learning_rate": 0.5})})
    longer = s.model_copy(update={"hyperparameters": hp.model_copy(update={"epochs": 9})})
    assert lineage(swept, DATA) == lineage(s, DATA) != lineage(longer, DATA)  # the swept values do not count


def test_a_trial_left_running_by_a_task_gone_for_good_is_failed_by_the_next_look(trainyard_home, monkeypatch):
    import time

    from trainyard.sweeps import study as study_module

    s = spec()
    stray = open_study(s).ask()  # asked, then its process died before it named its run
    assert fail_left_running(open_study(s), None, now=time.time()) == []  # recent: it may still be starting
    monkeypatch.setattr(study_module, "STALE_AFTER_S", 0.0)
    assert fail_left_running(open_study(s), None, now=time.time() + 1) == [stray.number]


def test_no_finished_trial_is_an_error_naming_the_states(trainyard_home):
    s = spec()
    run_trial(s, RUN, 0, worker([0.6, 0.8, 0.9]))
    with pytest.raises(SweepError, match="no trial on this data and spec finished"):
        close(spec(name="other"), DATA, RUN)
    done = run_trial(s, RUN, 1, worker([0.6, 0.8, 0.9]), of_lineage=lineage(s, DATA))
    Path(open_study(s).trials[-1].user_attrs[TRAINED_ATTR]["model_path"]).unlink()  # removed by hand
    with pytest.raises(
        SweepError, match=rf"trials \[{done['trial']}\] finished, but left no model file that is still there"
    ):
        close(s, DATA, RUN)


def test_a_finished_trial_whose_stored_result_is_not_a_record_is_passed_over(trainyard_home):
    """A trial stored in another shape (an older trainyard's, or edited in the study) has no model to
    register: close names it instead of failing the sweep on a validation error."""
    from trainyard.sweeps.study import LINEAGE_ATTR

    s = spec()
    study = open_study(s)
    odd = optuna.trial.create_trial(
        value=0.9, user_attrs={LINEAGE_ATTR: lineage(s, DATA), TRAINED_ATTR: {"model": "x"}}
    )
    study.add_trial(odd)
    number = open_study(s).trials[-1].number
    with pytest.raises(SweepError, match=rf"trials \[{number}\] finished, but left no model file that is still there"):
        close(s, DATA, RUN)


def test_a_trial_s_training_result_is_kept_in_the_study_as_its_record(trainyard_home):
    """The trial's TrainingResult goes into the study as JSON and comes back the same record; one stored
    before the record, a built-in recipe's val_* metrics beside its other fields, is read as one too."""
    from trainyard.sweeps.study import trained_of

    s = spec()
    run_trial(s, RUN, 0, worker([0.6, 0.8, 0.9]))
    (done,) = open_study(s).trials
    trained = trained_of(done)
    assert trained.final_metrics == {"val_accuracy": 0.9, "val_loss": pytest.approx(0.1)}
    assert Path(trained.model_path).is_file() and trained.steps == 3
    stored = done.user_attrs[TRAINED_ATTR]
    earlier = {**{k: v for k, v in stored.items() if k != "final_metrics"}, **stored["final_metrics"]}
    assert trained_of(optuna.trial.create_trial(value=0.9, user_attrs={TRAINED_ATTR: earlier})) == trained


def _trial(prune_below: float = -1.0):
    """A real Optuna trial of an in-memory study whose pruner stops values below ``prune_below``."""
    return optuna.create_study(pruner=optuna.pruners.ThresholdPruner(lower=prune_below)).ask()


def test_the_watcher_stops_the_workers_on_a_malformed_or_linked_report(tmp_path):
    from trainyard.sweeps.trials import Watcher
    from trainyard.training.run_config import WorkerOutputError

    (tmp_path / handshake.REPORTS).write_text('{"epoch": 1, "value": 0.5}\n{"epoch": "x"}\n')
    with Watcher(_trial(), tmp_path, poll_s=0.01) as w:
        assert w.halt.wait(5)
    assert isinstance(w.error, WorkerOutputError) and w.reported == {1: 0.5}

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / handshake.REPORTS).symlink_to(tmp_path / handshake.REPORTS)
    with Watcher(_trial(), linked, poll_s=0.01) as w:
        assert w.halt.wait(5)
    assert isinstance(w.error, WorkerOutputError) and "not a regular file of its own" in str(w.error)


def test_workers_that_go_on_after_the_pruners_word_are_stopped_and_a_lost_lease_stops_them(tmp_path):
    import threading

    from trainyard.sweeps.trials import Watcher

    handshake.report(tmp_path, 1, 0.1)
    with Watcher(_trial(prune_below=0.5), tmp_path, grace_s=0.2, poll_s=0.01) as w:
        assert w.halt.wait(5) and w.overstayed and w.pruned_at == 1
    lost = threading.Event()
    with Watcher(_trial(), tmp_path / "none", lost, poll_s=0.01) as w:
        lost.set()
        assert w.halt.wait(5) and not w.overstayed


def test_a_custom_programs_reports_are_its_metrics_lines_holding_the_objective(tmp_path):
    """Each line with the objective and a new step is the next reporting point; a line without it is no
    point; a program restarted from a checkpoint repeats steps, which are answered, not reported again;
    after the pruner's word nothing more is reported. Every point gets its verdict."""
    import time

    from trainyard.sweeps.trials import Watcher
    from trainyard.training.metrics import METRICS_FILE

    def lines(*rows):
        with open(tmp_path / METRICS_FILE, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)

    def answered(point):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if handshake.wait_verdict(tmp_path, point, timeout_s=0.05) is not None:
                return handshake.wait_verdict(tmp_path, point, timeout_s=0.05)
        raise AssertionError(f"no verdict for point {point}")

    trial = _trial(prune_below=0.5)
    with Watcher(trial, tmp_path, poll_s=0.01, objective_in_metrics="val_accuracy") as w:
        lines({"step": 10, "train_loss": 2.0}, {"step": 100, "train_loss": 1.0, "val_accuracy": 0.6})
        assert answered(1) is False
        lines({"step": 100, "val_accuracy": 0.9}, {"step": 200, "val_accuracy": 0.7})  # a restart, then point 2
        assert answered(2) is False
        lines({"step": 300, "val_accuracy": 0.2})
        assert answered(3) is True
        lines({"step": 400, "val_accuracy": 0.9})  # a program deaf to the verdict goes on
        time.sleep(0.1)
    assert w.reported == {1: 0.6, 2: 0.7, 3: 0.2} and w.pruned_at == 3
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {1: 0.6, 2: 0.7, 3: 0.2}


def test_a_settled_watcher_judges_no_more_and_too_many_points_or_a_replaced_file_are_handled(tmp_path):
    """Once the workers have ended (settle), a report read late is recorded but stops nothing; a program
    reporting more points than allowed fails its trial; a metrics file replaced under the watcher is read
    again from its start, its repeated steps not reported twice."""
    from trainyard.sweeps.trials import Watcher
    from trainyard.training.metrics import METRICS_FILE
    from trainyard.training.run_config import WorkerOutputError

    metrics = tmp_path / METRICS_FILE
    with Watcher(_trial(prune_below=0.5), tmp_path, poll_s=0.01, objective_in_metrics="acc") as w:
        assert w.settle() is False
        metrics.write_text('{"step": 1, "acc": 0.1}\n')  # read after the end: below the threshold
    assert w.reported == {1: 0.1} and w.pruned_at is None and not w.settle()

    metrics.write_text("".join(f'{{"step": {i}, "acc": 0.9}}\n' for i in range(1, 5)))
    with Watcher(_trial(), tmp_path, poll_s=0.01, objective_in_metrics="acc", max_points=3) as w:
        assert w.halt.wait(5)
    assert isinstance(w.error, WorkerOutputError) and "more than 3 reporting points" in str(w.error)

    metrics.write_text('{"step": 1, "acc": 0.6}\n{"step": 2, "acc": 0.7}\n')
    trial = _trial()
    with Watcher(trial, tmp_path, poll_s=0.01, objective_in_metrics="acc") as w:
        deadline = time.monotonic() + 5
        while len(w.reported) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        replaced = tmp_path / "new"
        replaced.write_text('{"step": 2, "acc": 0.7}\n{"step": 3, "acc": 0.8}\n')
        replaced.replace(metrics)  # a restarted program that opened it with "w"
        while len(w.reported) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert w.reported == {1: 0.6, 2: 0.7, 3: 0.8} and w.error is None


def test_a_verdict_replaces_a_link_planted_in_its_place(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    work = tmp_path / "work"
    work.mkdir()
    (work / handshake.VERDICT).symlink_to(target)
    handshake.write_verdict(work, 2, True)
    assert target.read_text() == "keep" and not (work / handshake.VERDICT).is_symlink()
    assert handshake.wait_verdict(work, 2, timeout_s=1) is True
    assert handshake.wait_verdict(work, 3, timeout_s=0.1) is None  # no answer for a later epoch yet


def test_teams_keep_their_studies_apart(trainyard_home):
    from trainyard.sweeps.study import team_schema

    mine = spec()
    theirs = parse_spec({**mine.model_dump(mode="json"), "resources": {"gpus_per_node": 1, "team": "nlp"}})
    run_trial(mine, RUN, 0, worker([0.5, 0.6, 0.7]))
    assert (len(open_study(mine).trials), len(open_study(theirs).trials)) == (1, 0)
    assert team_schema("a-b") != team_schema("a_b") and team_schema("vision").startswith("sweeps_vision_")
