"""Airflow's REST API from the command line, through the official client (``apache-airflow-client``).

Where Airflow is and who asks come from the environment (``AIRFLOW_API_TOKEN``, a token from ``POST
/auth/token``, or ``AIRFLOW_API_USERNAME`` and ``AIRFLOW_API_PASSWORD``; ``AIRFLOW_API_URL``, default
``http://localhost:8080``) or from the file ``$XDG_CONFIG_HOME/trainyard/airflow.json`` (``~/.config/...``;
keys ``url``, ``token``, ``username``, ``password``), which must be readable by its owner only. Never from
the command line: a password there is in the shell history and in every process listing.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import CommandError

ENV_PREFIX = "AIRFLOW_API_"
LOGIN_FIELDS = ("url", "token", "username", "password")
DEFAULT_URL = "http://localhost:8080"  # `make up`


@dataclass(frozen=True)
class AirflowLogin:
    url: str
    token: str | None = None
    username: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # a traceback or a log line must not show the secret
        return f"AirflowLogin(url={self.url!r}, username={self.username!r})"


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainyard" / "airflow.json"


def require_login() -> AirflowLogin:
    """:func:`find_login`, or CommandError saying how to give one."""
    login = find_login()
    if login is None:
        raise CommandError(
            f"no Airflow login: set {ENV_PREFIX}TOKEN (a token from POST $AIRFLOW_API_URL/auth/token), or "
            f"{ENV_PREFIX}USERNAME and {ENV_PREFIX}PASSWORD, and {ENV_PREFIX}URL (default {DEFAULT_URL}); or "
            f"write them to {config_file()} (chmod 600)"
        )
    return login


def find_login() -> AirflowLogin | None:
    """The login from the environment, else from the config file; None when neither holds one. A config
    file that others may read is refused (CommandError saying how to fix it)."""
    env = {f: os.environ.get(ENV_PREFIX + f.upper()) for f in LOGIN_FIELDS}
    if env["token"] or env["username"]:
        return _login({**env, "url": env["url"] or DEFAULT_URL}, f"the environment ({ENV_PREFIX}*)")
    path = config_file()
    if not path.exists():
        return None
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CommandError(
            f"{path} holds Airflow credentials but is readable or writable by others "
            f"(mode {stat.filemode(st.st_mode)}): run 'chmod 600 {path}' as its owner"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CommandError(f"{path}: not a JSON object with {', '.join(LOGIN_FIELDS)}: {err}") from None
    if not isinstance(data, dict) or set(data) - set(LOGIN_FIELDS):
        raise CommandError(f"{path}: expected a JSON object with keys among {', '.join(LOGIN_FIELDS)}")
    if os.environ.get(ENV_PREFIX + "URL"):  # the environment says where, the file who
        data = {**data, "url": os.environ[ENV_PREFIX + "URL"]}
    return _login(data, str(path))


def _login(fields: dict[str, Any], where: str) -> AirflowLogin:
    if not fields.get("url"):
        raise CommandError(f"{where}: no url of the Airflow API server")
    if not fields.get("token") and not (fields.get("username") and fields.get("password")):
        raise CommandError(f"{where}: give a token, or a username and a password, for {fields['url']}")
    return AirflowLogin(
        url=str(fields["url"]).rstrip("/"),
        token=fields.get("token") or None,
        username=fields.get("username") or None,
        password=fields.get("password") or None,
    )


def api_client(login: AirflowLogin) -> Any:
    """An ``airflow_client.client.ApiClient`` authorised as ``login`` (a token from ``POST /auth/token``
    when it holds a username and password)."""
    import airflow_client.client as af

    return af.ApiClient(af.Configuration(host=login.url, access_token=bearer_token(login)))


def bearer_token(login: AirflowLogin) -> str:
    """The login's token, or one from ``POST /auth/token`` for its username and password."""
    import requests

    if login.token:
        return login.token
    try:
        r = requests.post(
            f"{login.url}/auth/token", json={"username": login.username, "password": login.password}, timeout=30
        )
    except requests.RequestException as err:
        raise CommandError(f"cannot reach Airflow at {login.url}: {err}") from None
    if r.status_code not in (200, 201):
        raise CommandError(f"Airflow at {login.url} refused the login of {login.username!r} (HTTP {r.status_code})")
    return str(r.json()["access_token"])


def announce_commit(login: AirflowLogin, upload: dict) -> str:
    """Post an asset event for a new commit (an ``upload_folder`` result) on its branch's asset, as
    ``ingest_dataset`` does, so the job files that retrain on that branch start. Returns what happened, in
    words; a branch no job file listens to has no asset, and nothing is posted."""
    import airflow_client.client as af
    from urllib3.exceptions import HTTPError

    from trainyard.retraining import dataset_uri

    uri = dataset_uri(upload["store"], upload["repo"], upload["branch"])
    with api_client(login) as client:
        assets = af.AssetApi(client)
        try:
            found = [a for a in assets.get_assets(uri_prefix_pattern=uri).assets if a.uri == uri]
            if not found:
                return f"no job file retrains on {uri}: the commit was not announced"
            extra = {k: upload[k] for k in ("store", "repo", "branch", "commit", "digest")}
            assets.create_asset_event(af.CreateAssetEventsBody(asset_id=found[0].id, extra=extra))
        except af.ApiException as err:
            raise CommandError(
                f"Airflow at {login.url} refused the asset event for {uri} (HTTP {err.status}; posting one "
                "needs the op role)"
            ) from None
        except HTTPError as err:
            raise CommandError(f"cannot reach Airflow at {login.url}: {err}") from None
    return f"announced commit {upload['commit'][:12]} on {uri}"


def token_claims(token: str) -> dict:
    """The claims of a JWT (not verified here: the API server verifies the token when it is used)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError) as err:
        raise CommandError(f"the Airflow API token is not a JWT ({err}); get one with POST /auth/token") from None
    if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str):
        raise CommandError("the Airflow API token names no user (no 'sub' claim); get one with POST /auth/token")
    return claims


@dataclass(frozen=True)
class Caller:
    """Who a login is, as the API server says: its user name and Airflow role."""

    user: str
    role: str


def whoami(login: AirflowLogin) -> Caller:
    """The user of ``login``, verified by the API server (``GET /ui/auth/me`` answers only a token it
    signed), and the role its token holds; CommandError where the server refuses it."""
    import requests

    token = bearer_token(login)
    try:
        r = requests.get(f"{login.url}/ui/auth/me", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except requests.RequestException as err:
        raise CommandError(f"cannot reach Airflow at {login.url}: {err}") from None
    if r.status_code in (401, 403):
        raise CommandError(f"Airflow at {login.url} does not accept the login (HTTP {r.status_code}): get a new token")
    if not r.ok:
        raise CommandError(f"Airflow at {login.url} could not say who the login is (HTTP {r.status_code})")
    return Caller(str(r.json()["username"]), str(token_claims(token).get("role", "")).lower())
