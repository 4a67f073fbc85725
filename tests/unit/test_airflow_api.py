"""Where the command line finds Airflow and its credentials: the environment, else a file only its owner
may read; never the command line."""

import json
import os

import pytest

from trainyard.airflow_api import AirflowLogin, config_file, find_login, require_login
from trainyard.errors import CommandError


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for field in ("URL", "TOKEN", "USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"AIRFLOW_API_{field}", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _write(data: dict, mode: int = 0o600):
    path = config_file()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    os.chmod(path, mode)
    return path


def test_nothing_configured_is_no_login_and_the_error_says_how_to_give_one(monkeypatch):
    assert find_login() is None
    monkeypatch.setenv("AIRFLOW_API_URL", "http://env:8080")  # a url alone is no login
    with pytest.raises(CommandError, match="set AIRFLOW_API_TOKEN"):
        require_login()


def test_a_token_alone_talks_to_the_local_api_server(monkeypatch):
    monkeypatch.setenv("AIRFLOW_API_TOKEN", "t")
    assert find_login() == AirflowLogin(url="http://localhost:8080", token="t")


def test_the_environment_comes_first_and_a_secret_never_shows(monkeypatch):
    _write({"url": "http://file:8080", "token": "from-file"})
    monkeypatch.setenv("AIRFLOW_API_URL", "http://env:8080/")
    monkeypatch.setenv("AIRFLOW_API_USERNAME", "tina")
    monkeypatch.setenv("AIRFLOW_API_PASSWORD", "s3cret")
    login = find_login()
    assert login == AirflowLogin(url="http://env:8080", username="tina", password="s3cret")
    assert "s3cret" not in repr(login) and "s3cret" not in str(login)


def test_a_file_only_its_owner_reads_is_used_where_the_environment_says(monkeypatch):
    _write({"url": "http://file:8080", "token": "t"})
    assert find_login() == AirflowLogin(url="http://file:8080", token="t")
    monkeypatch.setenv("AIRFLOW_API_URL", "http://staging:8080")
    assert find_login() == AirflowLogin(url="http://staging:8080", token="t")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o602])
def test_a_file_others_may_read_or_write_is_refused_saying_how_to_fix_it(mode):
    path = _write({"url": "http://file:8080", "token": "t"}, mode)
    with pytest.raises(CommandError, match=f"chmod 600 {path}"):
        find_login()


@pytest.mark.parametrize(
    "data, problem",
    [
        ({"token": "t"}, "no url"),
        ({"url": "http://a"}, "give a token, or a username and a password"),
        ({"url": "http://a", "username": "tina"}, "give a token, or a username and a password"),
        ({"url": "http://a", "token": "t", "pasword": "x"}, "keys among"),
    ],
)
def test_an_incomplete_login_is_refused_naming_what_is_missing(data, problem):
    _write(data)
    with pytest.raises(CommandError, match=problem):
        find_login()
