import json
import os

import pytest

from trainyard.cli import main as cli
from trainyard.data.classification import digits_files
from trainyard.data.store import LocalStore, NotFound
from trainyard.data.upload import UploadError, collect_folder, upload_folder


def _write(folder, files):
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def digits():
    return digits_files()


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def test_upload_commits_a_validated_folder(tmp_path, store, digits):
    folder = _write(tmp_path / "ds", digits)
    first = upload_folder(store, "d", "main", folder)
    assert first["kind"] == "image_classification" and first["files"] == len(digits)
    assert store.resolve("d", "main") == first["commit"]
    assert store.get_commit("d", first["commit"]).metadata["validated_by"] == "image_classification"
    assert first["new_commit"]
    # Same bytes again: same commit, nothing new. A removed sample disappears from the next version only.
    again = upload_folder(store, "d", "main", folder)
    assert (again["commit"], again["new_commit"]) == (first["commit"], False)
    os.remove(folder / "images" / "digits-01796.npy")
    (folder / "labels.csv").write_text("\n".join((folder / "labels.csv").read_text().splitlines()[:-1]) + "\n")
    second = upload_folder(store, "d", "main", folder)
    assert second["commit"] != first["commit"] and second["new_commit"]
    assert store.diff("d", first["commit"], second["commit"]) == {
        "added": [],
        "removed": ["images/digits-01796.npy"],
        "changed": ["labels.csv"],
    }
    assert store.read("d", first["commit"], "images/digits-01796.npy")


def test_invalid_data_is_never_committed(tmp_path, store, digits):
    bad = dict(digits)
    lines = bad["labels.csv"].decode().splitlines()
    lines[1] = lines[1].split(",")[0] + ",11"
    bad["labels.csv"] = ("\n".join(lines) + "\n").encode()
    folder = _write(tmp_path / "bad", bad)
    with pytest.raises(UploadError, match="nothing committed") as err:
        upload_folder(store, "d", "main", folder)
    assert "expect_column_values_to_be_between(column=label" in str(err.value)
    assert not store.repo_exists("d")


def test_empty_folder_refused(tmp_path, store):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(UploadError, match="has no files"):
        upload_folder(store, "d", "main", tmp_path / "empty")


def test_symlink_out_of_the_folder_refused(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (tmp_path / "secret").write_text("x")
    (folder / "ok.txt").write_text("y")
    os.symlink(tmp_path / "secret", folder / "leak")
    with pytest.raises(UploadError, match="leak: symlink points outside the folder"):
        collect_folder(folder)


def test_symlink_inside_the_folder_is_fine(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "a.txt").write_text("y")
    os.symlink(folder / "a.txt", folder / "b.txt")
    assert sorted(collect_folder(folder)) == ["a.txt", "b.txt"]


def test_changed_after_validation_refused(tmp_path, store, digits):
    folder = _write(tmp_path / "ds", digits)
    with pytest.raises(UploadError, match="changed since validation"):
        upload_folder(store, "d", "main", folder, expected_digest="0" * 64)
    with pytest.raises(NotFound):
        store.resolve("d", "main")


def test_cli_upload_needs_a_login_that_says_whose_the_data_is(tmp_path, trainyard_home, digits, capsys, no_login):
    folder = _write(tmp_path / "ds", digits)
    assert cli(["data", "upload", str(folder), "--repo", "r"]) == 1
    assert "no Airflow login: set AIRFLOW_API_TOKEN" in capsys.readouterr().err
    assert not LocalStore(trainyard_home / "datasets").repo_exists("r")


def test_cli_upload_prints_the_commit_and_the_team_owns_it(tmp_path, trainyard_home, digits, capsys, login_as):
    folder = _write(tmp_path / "ds", digits)
    login_as("alice")  # teams default ("*": everyone) and vision
    assert cli(["data", "upload", str(folder), "--repo", "r"]) == 1
    assert "user 'alice' is a member of teams default, vision: say which with --team" in capsys.readouterr().err
    assert cli(["data", "upload", str(folder), "--repo", "r", "--team", "nlp"]) == 1
    assert "user 'alice' is not a member of team 'nlp'" in capsys.readouterr().err
    assert cli(["data", "upload", str(folder), "--repo", "r", "--branch", "main", "--team", "vision"]) == 0
    printed = capsys.readouterr()
    commit = printed.out.strip()
    assert len(commit) == 64
    assert LocalStore(trainyard_home / "datasets").resolve("r", "main") == commit
    assert "(team vision)" in printed.err
    assert "the commit was not announced" in printed.err  # said, not hidden
    assert cli(["data", "upload", str(folder), "--repo", "r", "--team", "vision"]) == 0
    assert "nothing new to commit" in capsys.readouterr().err
    assert cli(["data", "tag", "v1", "--repo", "r"]) == 0
    assert capsys.readouterr().out.strip() == commit
    assert cli(["data", "owner", "--repo", "r"]) == 0
    assert capsys.readouterr().out.strip() == "team vision's"
    assert cli(["data", "upload", str(tmp_path / "nope"), "--repo", "r", "--team", "vision"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: ") and "not a directory" in err  # one line, no traceback

    login_as("bob")  # teams default and nlp: vision's repository is not theirs to read, tag or upload to
    for command in (["log"], ["ls"], ["tag", "v2"], ["upload", str(folder), "--team", "nlp"], ["owner"]):
        assert cli(["data", *command, "--repo", "r"]) == 1, command
        assert "'r' belongs to team 'vision'; " in capsys.readouterr().err
    assert cli(["data", "owner", "--repo", "r", "nlp", "--replace"]) == 1
    assert "only an Airflow admin names a dataset repository's owner" in capsys.readouterr().err

    login_as("admin", "admin")  # an admin reads every team's and names owners
    assert cli(["data", "log", "--repo", "r"]) == 0
    assert capsys.readouterr().out.startswith(commit)
    assert cli(["data", "owner", "--repo", "r", "nlp"]) == 1
    assert "pass --replace" in capsys.readouterr().err
    assert cli(["data", "owner", "--repo", "r", "nlp", "--replace"]) == 0
    assert capsys.readouterr().out.strip() == "r: team vision's -> team nlp's"


@pytest.mark.parametrize(
    "meta, message",
    [
        (["0", "1"], r"classes.json: is a JSON list; expected an object \{\"classes\""),
        ({"classes": ["0"], "height": 8}, r"classes.json: 'width' is missing; 'pixel_max' is missing; expected"),
        (
            {"classes": "01", "height": 8, "width": 0, "pixel_max": 16},
            r"'classes' must be a non-empty list of names, got '01'; 'width' must be a positive integer, got 0",
        ),
    ],
)
def test_malformed_classes_json_is_named_not_a_traceback(tmp_path, store, meta, message):
    folder = _write(tmp_path / "ds", {"classes.json": json.dumps(meta).encode(), "labels.csv": b"key,label\n"})
    with pytest.raises(ValueError, match=message):
        upload_folder(store, "d", "main", folder)
    assert not store.repo_exists("d")


def test_the_same_data_validated_again_into_one_report_folder_replaces_it(tmp_path, digits):
    """An identical upload (or a retried task) validates into the folder its first validation left; the
    report is replaced whole, not refused because the first one's project is there."""
    from trainyard.data.upload import validate_folder

    folder = _write(tmp_path / "ds", digits)
    docs = tmp_path / "ingest" / "d-0123"
    first = validate_folder(folder, "image_classification", docs_dir=docs)
    second = validate_folder(folder, "image_classification", docs_dir=docs)
    assert first.success and second.success and second.docs and os.path.exists(second.docs)
    assert sorted(p.name for p in docs.parent.iterdir()) == ["d-0123"]  # nothing set aside is left behind


def test_a_classes_json_list_names_the_file_and_the_shape(tmp_path, store):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "classes.json").write_text(json.dumps(["cat", "dog"]))
    (folder / "labels.csv").write_text("key,label\n")
    with pytest.raises(Exception) as err:
        upload_folder(store, "d", "main", folder)
    assert f"{folder / 'classes.json'}: is a JSON list; expected an object" in str(err.value)
    assert '"classes": ["name", ...]' in str(err.value)
