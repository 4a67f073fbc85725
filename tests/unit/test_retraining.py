"""Job files: what makes a DAG, what is refused (naming the file and field), and which commit a run trains."""

from pathlib import Path

import pytest

from trainyard.retraining import (
    JobFileError,
    commit_from_events,
    dataset_uri,
    load_jobs_folder,
    pinned,
    plan_retraining,
    read_job_file,
)
from trainyard.spec import SPEC_DIGEST_TAG, spec_digest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "include" / "config" / "retraining").glob("*.yaml"))
NIGHTLY = 'schedule: {cron: "30 1 * * *", timezone: Europe/Berlin}\n'
ON_DATA = "retrain_on: new_commits\ndataset: {repo: pets, ref: main, source: none}\n"


def _job(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_the_shipped_examples_are_valid_jobs():
    assert EXAMPLES
    for path in EXAMPLES:
        job = read_job_file(path)
        assert job.dag_id == f"retrain_{path.stem}"


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("nightly.yaml", NIGHTLY, ("30 1 * * *", "Europe/Berlin", None)),
        ("on-data.yaml", ON_DATA, (None, None, "new_commits")),
        ("both.yml", NIGHTLY + ON_DATA, ("30 1 * * *", "Europe/Berlin", "new_commits")),
    ],
)
def test_a_job_is_a_jobspec_plus_when_to_train(tmp_path, name, text, expected):
    job = read_job_file(_job(tmp_path, name, text))
    cron = job.schedule and job.schedule.cron
    timezone = job.schedule and job.schedule.timezone
    assert (cron, timezone, job.retrain_on) == expected
    assert job.spec.name == "digits"  # the rest is a JobSpec, its defaults included


@pytest.mark.parametrize(
    "name, text, problems",
    [
        ("never.yaml", "name: x\n", ["needs a schedule, retrain_on, or both"]),
        ("cron.yaml", 'schedule: {cron: "0 25 * * *"}\n', ["schedule.cron: not a five-field cron"]),
        ("six.yaml", 'schedule: {cron: "0 0 1 * * *"}\n', ["schedule.cron: not a five-field cron"]),
        ("zone.yaml", 'schedule: {cron: "0 1 * * *", timezone: Mars/Base}\n', ["schedule.timezone: not an IANA"]),
        ("on.yaml", "retrain_on: always\n", ["retrain_on: must be one of 'new_commits'"]),
        # the JobSpec's fields and the job's own, told together and named as the file's keys
        ("both.yaml", NIGHTLY + "hyperparameters: {epochs: 0}\nbogus: 1\n", ["epochs:", "bogus: unknown"]),
        ("list.yaml", "- 1\n", ["expected a mapping"]),
        ("broken.yaml", "schedule: [\n", ["not readable as YAML"]),
        ("Upper.yaml", NIGHTLY, ["the file name 'Upper' makes the DAG id"]),
        ("folder-zone.yaml", 'schedule: {cron: "0 1 * * *", timezone: America}\n', ["schedule.timezone: not an IANA"]),
        ("tag.yaml", "retrain_on: new_commits\ndataset: {ref: 'v1 final'}\n", ["retrain_on needs dataset.ref to name"]),
    ],
)
def test_a_bad_job_file_is_refused_naming_the_file_and_field(tmp_path, name, text, problems):
    path = _job(tmp_path, name, text)
    with pytest.raises(JobFileError) as err:
        read_job_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    for problem in problems:
        assert problem in message, message
    assert "spec." not in message


def test_a_folder_gives_its_good_jobs_and_each_bad_file_s_error(tmp_path):
    _job(tmp_path, "a.yaml", NIGHTLY)
    _job(tmp_path, "a.yml", ON_DATA)  # the same DAG id as a.yaml
    _job(tmp_path, "b.yaml", "name: x\n")
    _job(tmp_path, "notes.txt", "not a job")
    jobs, errors = load_jobs_folder(tmp_path)
    assert [j.dag_id for j in jobs] == ["retrain_a"]
    assert set(errors) == {str(tmp_path / "a.yml"), str(tmp_path / "b.yaml")}
    assert "already made from" in errors[str(tmp_path / "a.yml")]
    assert load_jobs_folder(tmp_path / "missing") == ([], {})


def test_the_newest_event_names_the_commit_and_events_of_another_branch_are_refused(tmp_path):
    job = read_job_file(_job(tmp_path, "pets.yaml", ON_DATA))
    assert job.dataset_uri == dataset_uri("local", "pets", "main") == "trainyard://datasets/local/pets/main"
    events = [{"repo": "pets", "branch": "main", "commit": "a" * 64}, {}, {"commit": "b" * 64}, {"note": "x"}]
    assert commit_from_events([], job) is None
    assert commit_from_events(events, job) == "b" * 64
    assert commit_from_events([{}], job) is None  # an event without a commit: train the branch head
    with pytest.raises(ValueError, match="names branch 'dev', not 'main'"):
        commit_from_events([{"branch": "dev", "commit": "c" * 64}], job)


def test_the_spec_digest_changes_with_any_field_and_pinning(tmp_path):
    job = read_job_file(_job(tmp_path, "pets.yaml", ON_DATA))
    spec = pinned(job.spec, "c" * 64)
    assert spec.dataset.ref == "c" * 64 and job.spec.dataset.ref == "main"
    assert spec_digest(spec) == spec_digest(pinned(job.spec, "c" * 64))
    assert spec_digest(spec) != spec_digest(job.spec)
    other = spec.model_copy(update={"hyperparameters": spec.hyperparameters.model_copy(update={"seed": 7})})
    assert spec_digest(other) != spec_digest(spec)


def test_a_run_pins_the_head_or_the_event_s_commit_and_skips_what_is_registered(trainyard_home, tmp_path):
    """A real local store and a real MLflow registry: the commit comes from the event or the branch head; a
    version registered from that commit and spec makes the run skip, naming the version."""
    from trainyard.data.ownership import OWNER_KEY
    from trainyard.data.store import ingest_files
    from trainyard.data.stores import open_store
    from trainyard.tracking import mlflow_tracking as mt

    store = open_store("local")
    store.create_repo("pets", metadata={OWNER_KEY: "default"})  # team default's uploads
    first = ingest_files(store, "pets", "main", {"a.txt": b"1"}, "one", {}).id
    second = ingest_files(store, "pets", "main", {"a.txt": b"2"}, "two", {}).id
    job = read_job_file(_job(tmp_path, "pets.yaml", ON_DATA))

    other = ingest_files(store, "cats", "main", {"a.txt": b"3"}, "elsewhere", {}).id  # of another dataset
    plan = plan_retraining(job, [])
    assert (plan["commit"], plan["conf"]["dataset"]["ref"], plan["skip"]) == (second, second, None)
    assert plan_retraining(job, [{"commit": first}, {"commit": second}])["commit"] == second
    assert plan_retraining(job, [{"commit": first}])["commit"] == first  # an older commit of the branch
    # what an event's poster may not make a job train: another branch's commit, a ref that is no commit id
    for hostile, problem in ((other, "not on that branch"), (second[:12], "full commit id"), ("dev", "full commit"),
                             (["x"], "full commit id"), ("0" * 64, "not on that branch")):  # fmt: skip
        with pytest.raises(ValueError, match=problem):
            plan_retraining(job, [{"commit": hostile}])

    c = mt.client()
    run = c.create_run(mt.experiment_id(c, "digits", "default")).info.run_id
    c.create_registered_model("digits")
    spec = pinned(job.spec, second)
    tags = {"dataset.commit": second, SPEC_DIGEST_TAG: spec_digest(spec)}
    c.create_model_version("digits", source=f"runs:/{run}/model", run_id=run, tags=tags)
    skip = plan_retraining(job, [])["skip"]
    assert skip and skip.startswith("digits version 1 was trained on commit " + second[:12])
    assert plan_retraining(job, [{"commit": first}])["skip"] is None  # other data: train
    # a newer version from another spec: the newest is what counts
    c.create_model_version("digits", source=f"runs:/{run}/model", run_id=run, tags={"dataset.commit": second})
    assert plan_retraining(job, [])["skip"] is None
    # a run of the first commit and this spec that its gate stopped: not tried again on that data
    stopped = pinned(job.spec, first)
    c.create_run(
        mt.experiment_id(c, "digits", "default"),
        tags={"dataset.commit": first, SPEC_DIGEST_TAG: spec_digest(stopped), "gate.passed": "false",
              "trainyard.run_key": "train_pipeline/r9"},
    )  # fmt: skip
    skip = plan_retraining(job, [{"commit": first}])["skip"]
    assert skip and skip.startswith(f"run train_pipeline/r9 trained commit {first[:12]}")
    assert plan_retraining(job, [])["skip"] is None  # the head is other data
