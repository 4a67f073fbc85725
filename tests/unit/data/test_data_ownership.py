"""Dataset repositories belong to a team: the one that first uploaded to it, or every team for a built-in
source's public data. Checked at a job's data step, at an upload and by the ``trainyard data`` commands."""

import multiprocessing
from pathlib import Path

import pytest

from datafiles import prepared_in, write_files
from trainyard import pipeline
from trainyard.data import ownership
from trainyard.data.classification import digits_files
from trainyard.data.ownership import EVERY_TEAM, OWNER_KEY, NoOwner, RepoOwner
from trainyard.data.store import LocalStore
from trainyard.datasets import check_read, check_tag, check_upload, upload
from trainyard.teams import NotAllowed

RUN = "train_pipeline.nlp/r1"  # the run whose later tasks are handed the XComs below


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("digits"), digits_files())


def _job(team: str, repo: str, source: str = "none"):
    return pipeline.validate_spec(
        {"name": f"m-{team}", "dataset": {"repo": repo, "source": source}, "resources": {"team": team}}
    )


def test_an_upload_makes_the_repository_its_team_s_and_another_team_is_refused(store, digits_folder):
    first = upload(store, "pets", "main", digits_folder, "vision")
    assert ownership.owner(store, "pets") == RepoOwner("vision")
    assert store.get_commit("pets", first["commit"]).metadata["team"] == "vision"  # lineage on the commit
    with pytest.raises(NotAllowed, match="belongs to team 'vision'; team 'nlp' may not write to it"):
        upload(store, "pets", "main", digits_folder, "nlp")
    with pytest.raises(NotAllowed, match="belongs to team 'vision'"):
        check_upload(store, "pets", "nlp")
    check_upload(store, "pets", "vision")
    check_upload(store, "new-repo", "nlp")  # no such repository yet: the uploader's to make
    assert not store.repo_exists("new-repo")  # the check makes nothing


def test_a_job_reads_its_team_s_repositories_and_public_ones_only(trainyard_home, digits_folder):
    from trainyard.data.stores import open_store

    store = open_store("local")
    upload(store, "pets", "main", digits_folder, "vision")
    assert pipeline.resolve_dataset(_job("vision", "pets")).repo == "pets"
    with pytest.raises(NotAllowed, match="repository 'pets' belongs to team 'vision'; team 'nlp' may not read it"):
        pipeline.resolve_dataset(_job("nlp", "pets"))
    # a built-in source makes a public repository: every team's default job trains on the one `digits`
    for team in ("vision", "nlp"):
        pipeline.resolve_dataset(_job(team, "digits", "sklearn_digits"))
    assert ownership.owner(store, "digits") == RepoOwner(EVERY_TEAM, "sklearn_digits")
    with pytest.raises(NotAllowed, match="holds the built-in source 'sklearn_digits', shared by every team"):
        upload(store, "digits", "main", digits_folder, "nlp")  # nobody slips files into public data
    with pytest.raises(NotAllowed, match="holds the built-in source 'sklearn_digits'; ingest 'synthetic_shapes'"):
        pipeline.resolve_dataset(
            pipeline.validate_spec(
                {
                    "name": "shapes",
                    "recipe": "centernet_detector",
                    "dataset": {"repo": "digits", "source": "synthetic_shapes"},
                    "gates": [{"metric": "val_map", "min": 0.0}],
                    "resources": {"team": "nlp"},
                }
            )
        )
    with pytest.raises(NotAllowed, match="belongs to team 'vision'; team 'nlp' may not read"):
        pipeline.resolve_dataset(_job("nlp", "pets", "sklearn_digits"))  # a source into another team's repository


def test_a_repository_without_an_owner_is_refused_until_an_admin_names_one(store):
    store.create_repo("old")  # made before owners were recorded
    store.commit_files("old", "main", {"a.txt": b"1"}, "first")
    with pytest.raises(NoOwner, match="trainyard data owner --store local --repo old TEAM"):
        check_read(store, "old", ["vision"], admin=False)
    assert ownership.set_owner(store, "old", "vision") is None
    assert check_read(store, "old", ["vision"], admin=False) == RepoOwner("vision")
    with pytest.raises(Exception, match="pass --replace"):
        ownership.set_owner(store, "old", "nlp")
    assert ownership.set_owner(store, "old", "", source="sklearn_digits", replace=True) == RepoOwner("vision")
    assert ownership.owner(store, "old") == RepoOwner(EVERY_TEAM, "sklearn_digits")
    assert ownership.set_owner(store, "old", "nlp", replace=True).public
    assert ownership.owner(store, "old") == RepoOwner("nlp")  # the source key is cleared with it


def test_reads_and_tags_by_a_user_s_teams(store, digits_folder):
    upload(store, "pets", "main", digits_folder, "vision")
    store.create_repo("digits", metadata={OWNER_KEY: EVERY_TEAM, ownership.SOURCE_KEY: "sklearn_digits"})
    assert check_read(store, "pets", ["nlp", "vision"], admin=False) == RepoOwner("vision")
    with pytest.raises(NotAllowed, match="teams 'default', 'nlp' may not read it"):
        check_read(store, "pets", ["nlp", "default"], admin=False)
    with pytest.raises(NotAllowed, match="nobody logged in may not read it"):
        check_read(store, "pets", [], admin=False)
    assert check_read(store, "pets", [], admin=True) == RepoOwner("vision")
    assert check_read(store, "digits", [], admin=False).public  # public data: no login needed
    assert check_read(store, "nope", ["nlp"], admin=False) is None  # the store says it is missing
    check_tag(store, "pets", ["vision"], admin=False)
    with pytest.raises(NotAllowed, match="only an Airflow admin tags in it"):
        check_tag(store, "digits", ["vision"], admin=False)
    check_tag(store, "digits", [], admin=True)


def _claim(root, repo, team, results):
    found = ownership.claim(LocalStore(root), repo, team)
    results.put((team, found.team))


def test_teams_creating_one_repository_at_once_agree_on_one_owner(tmp_path):
    """Real processes: of four teams claiming a new name at once, one makes it and all four see it as its."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    teams = ["vision", "nlp", "research", "default"]
    procs = [ctx.Process(target=_claim, args=(tmp_path / "store", "shared-name", t, results)) for t in teams]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen = [results.get(timeout=5) for _ in teams]
    owners = {owner for _, owner in seen}
    assert len(owners) == 1 and owners <= set(teams)
    assert ownership.owner(LocalStore(tmp_path / "store"), "shared-name") == RepoOwner(owners.pop())


def test_a_later_task_s_dataset_and_files_are_held_to_the_job_whatever_its_xcom_says(trainyard_home, digits_folder):
    """Users may write XComs: a later task's copy of the pinned dataset must be the job's repository at a
    commit id, and the files a step hands on must be the job's own."""
    from trainyard import paths
    from trainyard.data.stores import open_store

    store = open_store("local")
    upload(store, "pets", "main", digits_folder, "vision")
    theirs = pipeline.resolve_dataset(_job("vision", "pets"))
    mine = pipeline.resolve_dataset(_job("nlp", "digits", "sklearn_digits"))
    job = _job("nlp", "digits", "sklearn_digits")
    xcom = mine.model_dump()  # as a later task is handed it
    assert pipeline.pinned_dataset(job, xcom) == mine
    forgeries = [{**xcom, "repo": "pets", "commit": theirs.commit}, {**xcom, "commit": "main"}]
    forgeries += [{**xcom, "commit": None}, {**xcom, "path": "/etc"}, {"repo": "digits"}]  # not even a record
    for forged in forgeries:
        with pytest.raises(NotAllowed, match="resolve_dataset's result was changed"):
            pipeline.pinned_dataset(job, forged)
    with pytest.raises(NotAllowed, match=r"not a PinnedDataset \(2 field\(s\) wrong: commit, path\)"):
        pipeline.pinned_dataset(job, {**xcom, "commit": None, "path": "/etc"})  # named, their values not
    own = paths.run_dir(job.name, "train_pipeline.nlp/r1")
    trained = _training("a1b2", str(own))
    exported = {"onnx_path": str(own / "model.onnx"), "input_example": str(own / "input_example.npz")}
    assert pipeline.held_export(job, trained, exported).onnx_path == exported["onnx_path"]
    other = paths.run_dir("vision-net", "train_pipeline.vision/r1")
    with pytest.raises(NotAllowed, match="is not a file of job 'm-nlp'"):
        pipeline.held_export(job, trained, {**exported, "torchscript_path": str(other / "model.torchscript.pt")})
    with pytest.raises(NotAllowed, match="is not a file of job"):
        pipeline.held_export(job, trained, {**exported, "artifacts": {"tokenizer": str(own / ".." / ".." / "x")}})


def test_a_later_task_s_training_plan_is_its_run_s_own_whatever_its_xcom_says(trainyard_home, monkeypatch):
    """collect_kubernetes reads plan_kubernetes's XCom: every path in it must be the run's own (one that
    follows from the job and the run key), and its MLflow run one of the job's experiment."""
    from trainyard import paths
    from trainyard.pipeline.records import held_plan

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    job, other = _job("nlp", "digits", "sklearn_digits"), _job("vision", "digits", "sklearn_digits")
    key = "train_pipeline.nlp/r1"
    data = prepared_in(trainyard_home)
    plan = pipeline.plan_training(job, pipeline.resolve_dataset(job), data, key)
    theirs = pipeline.plan_training(other, pipeline.resolve_dataset(other), data, "train_pipeline.vision/r1")
    xcom = plan.model_dump()
    assert held_plan(job, key, xcom) == plan
    forgeries = [{**xcom, field: getattr(theirs, field)} for field in xcom]  # each field another run's
    forgeries += [{**xcom, "tensorboard_dir": "/tmp/elsewhere"}, {**xcom, "env": {}}, {"run_dir": plan.run_dir}]
    for forged in forgeries:
        with pytest.raises(NotAllowed, match="trigger the job again"):
            held_plan(job, key, forged)
    with pytest.raises(NotAllowed):  # the same plan, held to another run of the job
        held_plan(job, "train_pipeline.nlp/r2", xcom)
    again = pipeline.plan_training(job, pipeline.resolve_dataset(job), data, "train_pipeline.nlp/r2")
    for forged in ({**xcom, "mlflow_run_id": again.mlflow_run_id}, {**xcom, "mlflow_run_id": ""}):
        with pytest.raises(NotAllowed, match="trigger the job again"):  # another run of the job's, or none
            held_plan(job, key, forged)


def _training(mlflow_run_id: str, run_dir: str, **fields):
    """A built-in training's result in ``run_dir``, every field set, as collect_training makes it."""
    from trainyard.pipeline.records import TrainingResult

    work = f"{run_dir}/work"
    return TrainingResult(
        **{
            "mlflow_run_id": mlflow_run_id,
            "run_dir": run_dir,
            "tensorboard_dir": f"{run_dir}/tensorboard",
            "wall_seconds": 12.5,
            "gpu_seconds": 25.0,
            "tries": 2,
            "cost": 0.0069,
            "model_path": f"{work}/model.pt",
            "steps": 92,
            "final_metrics": {"val_accuracy": 0.93, "val_loss": 0.21},
            "recipe": "digits_cnn",
            "epochs": 4,
            "world_size": 2,
            "strategy": "ddp",
            "train_seconds": 11.2,
            "resumed_from_step": 30,
            "samples_per_second": 1234.5,
            "loop_seconds": 9.8,
            "checkpoint_stall_seconds": 0.01,
            "checkpoints": 4,
            **fields,
        },
    )


def test_a_training_result_and_an_export_go_through_json_as_they_were(tmp_path):
    """Both records are JSON only at the XCom (the training's also in a sweep trial's attributes): what goes
    out as JSON comes back the same record, a built-in recipe's metrics and a custom program's in one field,
    a diverged training's NaN included."""
    import json
    import math

    from trainyard.pipeline.records import ExportedModel, TrainingResult

    built_in = _training("a1b2", str(tmp_path), sweep="lr", sweep_trial=3)
    custom = TrainingResult(
        mlflow_run_id="c3d4",
        run_dir=str(tmp_path),
        tensorboard_dir="tb",
        wall_seconds=3.0,
        gpu_seconds=6.0,
        tries=1,
        cost=0.0,
        onnx_path=str(tmp_path / "work" / "model.onnx"),
        steps=200,
        final_metrics={"val_accuracy": 0.9, "workers": 2.0},
    )
    exported = ExportedModel(
        onnx_path=str(tmp_path / "model.onnx"),
        input_example=str(tmp_path / "input_example.npz"),
        torchscript_path=str(tmp_path / "model.torchscript.pt"),
        artifacts={"tokenizer": str(tmp_path / "tokenizer")},
        parity={"passed": True, "mismatched": 0, "total": 320},
        torchscript_parity={"passed": True},
        metric="val_bleu",
        metric_torch=31.5,
        metric_onnx=31.5,
        details={"decode_mismatches": 0, "decoded_sentences": 64},
    )
    for record in (built_in, custom, exported, ExportedModel(onnx_path="m.onnx", input_example="x.npz")):
        assert type(record).model_validate(json.loads(json.dumps(record.model_dump(mode="json")))) == record
    assert custom.model_path is None and custom.recipe is None  # a custom command's has no loop record
    diverged = built_in.model_copy(update={"final_metrics": {"val_loss": math.nan}})
    back = TrainingResult.model_validate(json.loads(json.dumps(diverged.model_dump(mode="json"))))
    assert math.isnan(back.final_metrics["val_loss"])


def test_a_later_task_s_training_result_and_export_are_the_job_s_own_whatever_their_xcoms_say(
    trainyard_home, monkeypatch
):
    """evaluate, gate, export_onnx and register read training_result's XCom, register export_onnx's: each
    must be its record (nothing but its fields), every file it names the job's own and its MLflow run one
    of the job's experiment; gate and register gate on and register the metrics evaluate recorded, not its
    XCom (a custom program's read again from its metrics file); a refusal names what is wrong."""
    import json

    from trainyard import paths
    from trainyard.errors import PermanentError
    from trainyard.pipeline.records import (
        ExportedModel,
        held_evaluation,
        held_export,
        held_training,
        record_evaluation,
        record_verdict,
        trained_with,
    )

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    job, other = _job("nlp", "digits", "sklearn_digits"), _job("vision", "digits", "sklearn_digits")
    data = prepared_in(trainyard_home)
    plan = pipeline.plan_training(job, pipeline.resolve_dataset(job), data, RUN)
    theirs = pipeline.plan_training(other, pipeline.resolve_dataset(other), data, "train_pipeline.vision/r1")
    trained = _training(plan.mlflow_run_id, plan.run_dir, tensorboard_dir=plan.tensorboard_dir)
    xcom = json.loads(json.dumps(trained.model_dump(mode="json")))  # as a later task is handed it
    assert held_training(job, RUN, xcom) == trained
    assert held_training(job, RUN, trained) == trained  # a record already: held all the same
    forgeries = {
        "val_accuracy": {**xcom, "val_accuracy": 0.99},  # a field the record has not (a metric belongs in one)
        "tries": {**xcom, "tries": "many"},
        "final_metrics.val_accuracy": {**xcom, "final_metrics": {"val_accuracy": "high"}},
        "mlflow_run_id": {k: v for k, v in xcom.items() if k != "mlflow_run_id"},
    }
    for wrong, forged in forgeries.items():
        with pytest.raises(
            NotAllowed, match=rf"training_result's result is not a TrainingResult \(1 field\(s\) wrong: {wrong}\)"
        ):
            held_training(job, RUN, forged)
    elsewhere = {
        "model_path": f"{theirs.run_dir}/work/model.pt",  # another job's model
        "run_dir": f"{plan.run_dir}/../../../vision-net/r1",  # out of the job's runs by ..
        "onnx_path": "/etc/passwd",
    }
    for field, path in elsewhere.items():
        with pytest.raises(NotAllowed, match=f"{path} is not a file of job 'm-nlp'"):
            held_training(job, RUN, {**xcom, field: path})
    with pytest.raises(NotAllowed, match=f"MLflow run {theirs.mlflow_run_id} is one of 'm-vision', not of job 'm-nlp'"):
        held_training(job, RUN, {**xcom, "mlflow_run_id": theirs.mlflow_run_id})
    # another run of the same job: its model, or its MLflow run, has another lineage
    earlier = pipeline.plan_training(job, pipeline.resolve_dataset(job), data, "train_pipeline.nlp/r0")
    for field, path in (
        ("model_path", f"{earlier.run_dir}/work/model.pt"),
        ("run_dir", earlier.run_dir),
        ("run_dir", f"{plan.run_dir}/work"),  # inside the run, where its program may have left links
        ("onnx_path", f"{plan.run_dir}/work/elsewhere.onnx"),
    ):
        with pytest.raises(NotAllowed, match=f"{field} {path} is not run {RUN}'s of job 'm-nlp'"):
            held_training(job, RUN, {**xcom, field: path})
    with pytest.raises(
        NotAllowed, match=f"MLflow run {earlier.mlflow_run_id} is run train_pipeline.nlp/r0's, not {RUN}'s"
    ):
        held_training(job, RUN, {**xcom, "mlflow_run_id": earlier.mlflow_run_id})

    own = plan.run_dir
    exported = ExportedModel(
        onnx_path=f"{own}/model.onnx",
        input_example=f"{own}/input_example.npz",
        torchscript_path=f"{own}/model.torchscript.pt",
        artifacts={"tokenizer": f"{own}/tokenizer.model"},
        metric="val_accuracy",
        metric_torch=0.9,
        metric_onnx=0.9,
    )
    ex_xcom = json.loads(json.dumps(exported.model_dump(mode="json")))
    assert held_export(job, trained, ex_xcom) == exported
    with pytest.raises(
        NotAllowed, match=r"export_onnx's result is not an ExportedModel \(1 field\(s\) wrong: val_accuracy_onnx\)"
    ):
        held_export(job, trained, {**ex_xcom, "val_accuracy_onnx": 0.9})  # the recipe's own form, not the record's
    with pytest.raises(NotAllowed, match=r"1 field\(s\) wrong: onnx_path\)"):
        held_export(job, trained, {k: v for k, v in ex_xcom.items() if k != "onnx_path"})
    for field, path in (
        ("torchscript_path", f"{theirs.run_dir}/model.torchscript.pt"),
        ("input_example", "/tmp/x.npz"),
    ):
        with pytest.raises(NotAllowed, match=f"{path} is not a file of job 'm-nlp'"):
            held_export(job, trained, {**ex_xcom, field: path})
    with pytest.raises(NotAllowed, match="is not a file of job 'm-nlp'"):
        held_export(job, trained, {**ex_xcom, "artifacts": {"tokenizer": f"{theirs.run_dir}/tokenizer.model"}})
    another_run = f"{earlier.run_dir}/model.onnx"  # the same job's, but not the training this run exported
    with pytest.raises(NotAllowed, match=f"{another_run} is not a file of the training it exported"):
        held_export(job, trained, {**ex_xcom, "onnx_path": another_run})

    # gate and register read the metrics evaluate recorded in the run's directory, not its XCom, and only
    # for the model it measured; register only what the gate passed
    here = Path(plan.run_dir)
    model = Path(trained.model_path)
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"the weights evaluate measured")
    with pytest.raises(PermanentError, match="evaluate recorded no metrics for this run"):
        held_evaluation(here, trained, {"val_accuracy": 0.9})
    measured = {"val_accuracy": 0.75, "val_loss": 0.5}
    record_evaluation(here, trained, measured)
    assert held_evaluation(here, trained, json.loads(json.dumps(measured))) == measured
    for forged, named in (
        ({"val_accuracy": 0.99, "val_loss": 0.5}, "val_accuracy differ"),  # a gate it would not pass, passed
        ({"val_accuracy": 0.75}, "val_loss differ"),  # a metric dropped
        ({**measured, "val_map": 1.0}, "val_map differ"),  # one added
    ):
        with pytest.raises(NotAllowed, match=f"not what evaluate recorded for this run \\({named}\\)"):
            held_evaluation(here, trained, forged)
    with pytest.raises(NotAllowed, match="not a mapping of metrics"):
        held_evaluation(here, trained, [0.75, 0.5])
    with pytest.raises(NotAllowed, match="the gate has not passed the metrics evaluate recorded"):
        held_evaluation(here, trained, measured, passed_gate=True)  # gate's state set by hand
    record_verdict(here, False)
    with pytest.raises(NotAllowed, match="the gate has not passed"):
        held_evaluation(here, trained, measured, passed_gate=True)
    record_verdict(here, True)
    assert held_evaluation(here, trained, measured, passed_gate=True) == measured
    model.write_bytes(b"weights trained again since")  # train cleared and run again, evaluate not
    with pytest.raises(NotAllowed, match="evaluate measured another model than the training in"):
        held_evaluation(here, trained, measured)
    record_evaluation(here, trained, measured)  # evaluate again: a verdict is needed again
    with pytest.raises(NotAllowed, match="the gate has not passed"):
        held_evaluation(here, trained, measured, passed_gate=True)

    # a custom program's metrics are read again from its own file, whatever training_result says of them
    work = Path(plan.run_dir) / "work"
    (work / "metrics.jsonl").write_text('{"step": 1, "score": 0.5}\n{"step": 2, "score": 0.25}\n')
    claimed = trained.model_copy(update={"final_metrics": {"score": 0.99}})
    assert pipeline.evaluate(job.model_copy(update={"recipe": "custom"}), claimed, data) == {"score": 0.25}

    # and the later steps take the spec and the data from the run config the training started from
    assert trained_with(trained) == (job, data)
