"""Replay: what a version recorded, how an environment differs from it, the spec a replay runs, and the
comparison of its metrics; the commands' refusals before anything is sent to Airflow."""

import json
from pathlib import Path

import pytest

from datafiles import prepared_in
from trainyard import environment, replay
from trainyard.errors import CommandError
from trainyard.spec import SpecError, parse_spec

DEPS = ["numpy==2.0.0", "torch==2.13.0"]


def _rec(**changes) -> replay.Recorded:
    base = {
        "model": "digits",
        "version": "3",
        "run_id": "r",
        "spec": {"name": "digits", "dataset": {"repo": "digits", "ref": "main", "source": "none"}},
        "commit": "c" * 64,
        "code_version": "abc",
        "dependencies": DEPS,
        "dependencies_sha256": environment.digest(DEPS),
        "metrics": {"val_accuracy": 0.9312345678, "val_loss": 0.25},
    }
    return replay.Recorded(**{**base, **changes})


def test_the_installed_set_is_sorted_normalised_and_includes_this_project():
    found = environment.installed()
    names = [line.split("==")[0] for line in found]
    assert names == sorted(set(names)) and "trainyard" in names
    assert all(line == line.lower() and "_" not in line.split("==")[0] for line in found)


def test_an_environment_differs_by_code_version_and_each_changed_package():
    rec = _rec()
    assert replay.differences(rec, "abc", DEPS) == []
    changed = replay.differences(rec, "def", ["numpy==2.1.0", "scipy==1.0"])
    assert changed == [
        "code version: recorded abc, here def",
        "dependency numpy: 2.0.0 -> 2.1.0",
        "dependency torch: 2.13.0 -> not installed",
        "dependency scipy: not recorded -> 1.0",
    ]
    assert replay.differences(_rec(dependencies=None), "abc", ["numpy==2.1.0"]) == [
        "dependencies: the version recorded no list to compare with"
    ]


@pytest.mark.parametrize("recorded", ["unknown", "abc-dirty"])
def test_a_code_version_that_names_no_one_code_never_matches_itself(recorded):
    """'unknown' (an image without .git) matched 'unknown', and a bare '-dirty' tree any other dirty tree."""
    assert replay.differences(_rec(code_version=recorded), recorded, DEPS) == [
        f"code version: recorded {recorded}, here {recorded}"
    ]


def test_the_code_version_tells_apart_two_dirty_trees_and_code_without_git(tmp_path):
    import shutil
    import subprocess

    from trainyard.tracking.mlflow_tracking import _source_digest, code_version

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("lr = 0.1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    clean = code_version(repo)
    (repo / "train.py").write_text("lr = 0.2\n")
    one = code_version(repo)
    (repo / "train.py").write_text("lr = 0.3\n")
    other = code_version(repo)
    assert len(clean) == 40 and one.startswith(clean + "-dirty.") and other.startswith(clean + "-dirty.")
    assert one != other and replay.identifies_code(one)
    (repo / "notes.py").write_text("untracked\n")  # an untracked file is part of what runs
    assert code_version(repo) not in (one, other)
    shutil.rmtree(repo / ".git")  # a trainer image: the package's own files are digested
    assert code_version(repo).startswith("files.")
    package = tmp_path / "package"
    shutil.copytree(Path(__file__).resolve().parents[2] / "include" / "trainyard", package)
    before = _source_digest(package)
    (package / "spec.py").write_text((package / "spec.py").read_text() + "\n# changed\n")
    assert _source_digest(package) != before


def test_a_replay_runs_the_recorded_spec_on_the_recorded_commit_marked_as_a_replay():
    conf = replay.replay_conf(_rec())
    assert conf["dataset"]["ref"] == "c" * 64 and conf["replay_of"] == "digits:3"
    assert parse_spec(conf).name == "digits"
    with pytest.raises(SpecError, match="replay_of"):
        parse_spec({"replay_of": "digits"})
    assert replay.default_tolerance(_rec()) == 0.0
    gpu = _rec(spec={"resources": {"gpu_type": "a100-80gb"}})
    assert replay.default_tolerance(gpu) == replay.GPU_TOLERANCE


def test_the_comparison_is_exact_by_default_and_names_what_missed():
    rec = _rec()
    ok, table = replay.compare(rec.metrics, dict(rec.metrics), 0.0)
    assert ok and "0.9312345678" in table and table.endswith("tolerance: 0 (absolute)")
    ok, table = replay.compare(rec.metrics, {"val_accuracy": 0.9312345679, "val_loss": 0.25}, 0.0)
    assert not ok and "NO" in table
    assert replay.compare(rec.metrics, {"val_accuracy": 0.9312345679, "val_loss": 0.25}, 1e-6)[0]
    ok, table = replay.compare(rec.metrics, {"val_loss": 0.25}, 1.0)
    assert not ok and "missing" in table
    # a metric recorded only as a tag (6 significant digits) is compared at that precision
    assert replay.compare({"val_f1": 0.702196}, {"val_f1": 0.7021958761}, 0.0, frozenset({"val_f1"}))[0]
    assert not replay.compare({"val_f1": 0.702196}, {"val_f1": 0.7021968761}, 0.0, frozenset({"val_f1"}))[0]


def test_a_version_without_a_recorded_spec_cannot_be_replayed(trainyard_home, monkeypatch):
    from trainyard import paths
    from trainyard.tracking import mlflow_tracking as mt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    c = mt.client()
    run = c.create_run(mt.experiment_id(c, "old", "default")).info.run_id
    c.create_registered_model("old")
    c.create_model_version("old", source=f"runs:/{run}/model", run_id=run, tags={"dataset.commit": "c" * 64})
    with pytest.raises(CommandError, match="recorded no spec"):
        replay.recorded(c, "old", "1")
    with pytest.raises(Exception, match="old version 7"):
        replay.recorded(c, "old", "7")


def _registered(c, name: str, deps: list[str], code: str = "abc") -> None:
    """A registered version as ``train_pipeline`` leaves one: its run has the spec and dependency list."""
    from trainyard.tracking import mlflow_tracking as mt

    run = c.create_run(
        mt.experiment_id(c, name, "default"),
        tags={environment.DEPENDENCIES_TAG: environment.digest(deps), "code_version": code},
    ).info.run_id
    c.log_text(run, json.dumps({"name": name}), "spec/job_spec.json")
    c.log_text(run, "\n".join(deps) + "\n", environment.DEPENDENCIES_ARTIFACT)
    c.create_registered_model(name)
    tags = {"dataset.commit": "c" * 64, environment.DEPENDENCIES_TAG: environment.digest(deps), "code_version": code}
    c.create_model_version(name, source=f"runs:/{run}/model", run_id=run, tags=tags)


def test_the_training_task_refuses_an_environment_unlike_the_versions_unless_told(trainyard_home, monkeypatch):
    """Where the replay trains: the same code and packages pass; one package more is refused, naming it;
    with replay_exact false the difference is recorded instead, and the command reads it back."""
    from trainyard import paths
    from trainyard.errors import PermanentError
    from trainyard.tracking import mlflow_tracking as mt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    c = mt.client()
    _registered(c, "pets", DEPS)
    assert replay.check_environment(c, "pets:1", True, "abc", DEPS) == "none"
    more = [*DEPS, "zlib-probe==1.0"]
    with pytest.raises(
        PermanentError,
        match="differs from the one pets version 1 trained in.*: dependency zlib-probe: not recorded -> 1.0",
    ):
        replay.check_environment(c, "pets:1", True, "abc", more)
    with pytest.raises(PermanentError, match="code version: recorded abc, here def"):
        replay.check_environment(c, "pets:1", True, "def", DEPS)
    found = replay.check_environment(c, "pets:1", False, "abc", more)
    assert found == "dependency zlib-probe: not recorded -> 1.0"
    # what the replay's own run records, and `trainyard replay` prints
    exp = mt.experiment_id(c, "pets", "default")
    c.create_run(exp, tags={mt.RUN_KEY_TAG: "train_pipeline/replay-1", replay.DIFFERENCES_TAG: found})
    assert replay.differences_of_run(c, "pets", "train_pipeline/replay-1") == [found]
    assert replay.differences_of_run(c, "pets", "train_pipeline/no-such-run") == []
    assert replay.replay_conf(_rec(), exact=False)["replay_exact"] is False


@pytest.fixture
def no_login(monkeypatch, tmp_path):
    for field in ("URL", "TOKEN", "USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"AIRFLOW_API_{field}", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_submit_checks_the_spec_here_and_needs_a_login(tmp_path, no_login, capsys):
    from trainyard.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"hyperparameters": {"epochs": 0}}))
    assert main(["submit", str(bad)]) == 1
    assert "hyperparameters.epochs" in capsys.readouterr().err  # refused before anything is sent
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps({"name": "digits"}))
    assert main(["submit", str(good), "--wait"]) == 1
    assert "no Airflow login: set AIRFLOW_API_TOKEN" in capsys.readouterr().err
    for argv in (["runs", "status", "r1"], ["runs", "logs", "r1"], ["runs", "cancel", "r1"]):
        assert main(argv) == 1
        assert "no Airflow login" in capsys.readouterr().err


def test_a_replays_trainer_in_a_pod_compares_its_own_packages_with_the_versions(tmp_path):
    """In a pod the worker cannot see the image's packages, so the trainer checks itself: it writes its
    set for the collect step, and, given the version's set, refuses a difference unless replay_exact is
    false (then it writes the differences down). Only the first worker writes."""
    from trainyard.training.entry import REPLAY_DIFFERENCES_FILE, check_environment
    from trainyard.training.run_config import RunConfig

    def cfg(expected, exact=True):
        spec = parse_spec({"replay_of": "pets:1", "replay_exact": exact, "backends": {"launcher": "kubernetes"}})
        return RunConfig(spec=spec, out_dir=str(tmp_path), replay_dependencies=expected)

    check_environment(cfg(None), DEPS, first=False)
    assert not (tmp_path / environment.TRAINER_FILE).exists()
    check_environment(cfg(DEPS), DEPS, first=True)
    assert (tmp_path / environment.TRAINER_FILE).read_text().split() == DEPS
    assert (tmp_path / REPLAY_DIFFERENCES_FILE).read_text() == "none\n"
    newer = ["numpy==2.1.0", "torch==2.13.0"]
    with pytest.raises(SystemExit, match="differ from those pets:1 trained with.*: dependency numpy: 2.0.0 -> 2.1.0"):
        check_environment(cfg(DEPS), newer, first=True)
    check_environment(cfg(DEPS, exact=False), newer, first=True)
    assert (tmp_path / REPLAY_DIFFERENCES_FILE).read_text() == "dependency numpy: 2.0.0 -> 2.1.0\n"
    # what the version's trainer had; an older version's worker set where no trainer set was recorded
    assert replay.trainer_dependencies(_rec(trainer_dependencies=newer)) == newer
    assert replay.trainer_dependencies(_rec()) == DEPS
    with pytest.raises(CommandError, match="recorded no dependency set"):
        replay.trainer_dependencies(_rec(dependencies=None))


def test_a_kubernetes_replay_is_checked_in_its_pods_against_the_versions_trainer(trainyard_home, monkeypatch):
    """Planning a replay of a version for Kubernetes: the worker's own packages are not compared (the
    pods train in their image); the run config hands the pods the set the version's trainer had."""
    from trainyard import paths, pipeline
    from trainyard.pipeline.records import PinnedDataset
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.training.run_config import RunConfig

    monkeypatch.setenv("MLFLOW_TRACKING_URI", paths.mlflow_tracking_uri())
    c = mt.client()
    _registered(c, "pets", ["not-this==1.0"])  # a worker set unlike this one: a local check would refuse
    (run_id,) = [v.run_id for v in c.search_model_versions("name = 'pets'")]
    image = ["numpy==2.0.0", "torch==2.13.0", "trainyard==9"]
    c.log_text(run_id, "\n".join(image) + "\n", environment.TRAINER_ARTIFACT)
    spec = parse_spec({"name": "pets", "replay_of": "pets:1", "backends": {"launcher": "kubernetes"}})
    dataset = PinnedDataset(store="local", repo="pets", ref="main", commit="c" * 64, digest="d" * 64, files=1)
    plan = pipeline.plan_training(spec, dataset, prepared_in(trainyard_home), "train_pipeline/replay-k8s")
    assert RunConfig.load(plan.config_path).replay_dependencies == image
    assert replay.DIFFERENCES_TAG not in c.get_run(plan.mlflow_run_id).data.tags  # the pods say, at collect


def test_how_a_run_is_checked_is_not_part_of_what_it_trains():
    """replay_exact says how a replay is checked: the digest of what is trained (retraining's memory, a
    sweep's lineage) is the same with or without it (and the same as before the field existed: checked
    against 9f3f185 when it was added)."""
    from trainyard.spec import spec_digest

    assert spec_digest(parse_spec({})) == spec_digest(parse_spec({"replay_exact": False}))
