"""A team's MLflow experiments, runs and registered models readable by its members only, by MLflow's own
permissions, on a tracking server that runs MLflow's authentication app (``mlflow server --app-name
basic-auth``, as the cluster profile does):

* the server reads :func:`write_config`'s file: ``default_permission = NO_PERMISSIONS``, so a user reads
  nothing they were not given; its admin is trainyard's service account, whose name and password the
  Airflow components and workers hold (``MLFLOW_TRACKING_USERNAME``, ``MLFLOW_TRACKING_PASSWORD``), so the
  tasks log and register as it;
* each team of ``resources.yaml`` has a role, :func:`role_name`, in MLflow's default workspace;
* an experiment (a job name's, owned by the team of its first run) and a registered model (owned by the
  team that first registered it) are granted READ to the owning team's role as they are made
  (:func:`grant_team_read`, called by :func:`trainyard.tracking.mlflow_tracking.experiment_id` and
  :func:`trainyard.registry.ownership.claim`); their runs and versions follow them;
* :func:`sync` gives every Airflow user an MLflow user with the same password (one login for both UIs;
  a user Airflow no longer has loses theirs),
  makes Airflow's admins MLflow admins, assigns each user the roles of the teams ``resources.yaml`` lists
  them in (and takes the others away), and makes the roles' grants what the owner tags say (granting
  what a failed grant missed, taking back a model given to another team): run it after a change of
  ``members`` or owners (the cluster profile runs it at every ``up``);
* MLflow gives whoever makes an experiment or a model MANAGE on it, and any logged-in user may make one
  (with workspaces off): a user could make a team's next experiment or model before its job does. So what
  trainyard makes bears a seal only its service account can compute (:func:`sealed`), and a job refuses an
  experiment or model without it (:func:`check_sealed`); ``sync`` takes the users' own rights on every
  team-owned one away and seals it.

Where the tracking store is no such server (the local profile's SQLite store, read by whoever may read
its file) nothing here does anything: :func:`enabled`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainyard import paths

# The team that owns an MLflow object: a run's and an experiment's (the team of the job that made them), a
# registered model's (trainyard.registry.ownership): whose role may read it
TEAM_TAG = "trainyard.team"
# A seal only trainyard's service account can make (an HMAC keyed with its password): an experiment or a
# model that bears it was made by trainyard, so no user holds a creator's rights on it
SEAL_TAG = "trainyard.sealed"
READ = "READ"
WORKSPACE = "default"  # where MLflow keeps roles while workspaces are off
ROLE_PREFIX = "trainyard-team-"
SERVICE_USER_ENV, SERVICE_PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"


def enabled() -> bool:
    """Whether the tracking store is a server this process logs into (the auth app's service account)."""
    return bool(os.environ.get(SERVICE_USER_ENV)) and paths.mlflow_tracking_uri().startswith(("http://", "https://"))


def seal(kind: str, name: str, team: str) -> str | None:
    """The seal of MLflow ``kind`` (``experiment``, ``registered_model``) ``name`` owned by ``team``; None
    where the auth app is not in use (there is no creator's right to fear)."""
    if not enabled():
        return None
    key = os.environ.get(SERVICE_PASSWORD_ENV, "").encode()
    return hmac.new(key, f"{kind}\0{name}\0{team}".encode(), hashlib.sha256).hexdigest()


def sealed(kind: str, name: str, team: str) -> dict[str, str]:
    """The tags that make a new experiment or model ``team``'s (its seal with them, where one is made)."""
    mark = seal(kind, name, team)
    return {TEAM_TAG: team, **({SEAL_TAG: mark} if mark else {})}


def check_sealed(kind: str, name: str, team: str, tags: Mapping[str, str]) -> None:
    """Refuse to use an experiment or model that trainyard did not make, where the auth app is in use: a
    user who made it holds MANAGE on it (MLflow gives its creator that), so the team's runs or versions in it
    would be theirs to read and change."""
    from trainyard.errors import PermanentError

    mark = seal(kind, name, team)
    if mark is not None and not hmac.compare_digest(str(tags.get(SEAL_TAG, "")), mark):
        raise PermanentError(
            f"the MLflow {kind.replace('_', ' ')} {name!r} was not made by trainyard's service account (a user made "
            "it, or it is older than the tracking server's auth app), so its maker may hold rights on it that "
            f"team {team!r} does not give: an MLflow admin deletes it, or runs `python -m "
            "trainyard_airflow.mlflow_users`, which takes the users' own rights on trainyard's experiments and "
            "models away and seals them"
        )


def role_name(team: str) -> str:
    return f"{ROLE_PREFIX}{team}"


# How long a server process remembers a login it verified (MLflow's ``auth_cache_ttl_seconds``, off by
# default). Each check of a password against its scrypt hash costs the server 0.32 CPU-seconds: 100
# ``experiments/search`` requests of one login to a one-worker server took 31.9 CPU-s, 1.0 with the cache
# (2026-12-06, 2 cores); a pipeline's tasks, their metric relays and registrations send hundreds. A password
# change, an admin flag or a deletion through the API (trainyard's sync) drops the login on the worker that
# made it at once; another worker of the server may accept the old login for up to this long.
LOGIN_CACHE_S = 60


def write_config(path: Path, database_uri: str, service_user: str, service_password: str) -> Path:
    """The auth app's configuration (``MLFLOW_AUTH_CONFIG_PATH``): nobody reads what they were not given;
    the service account is its admin; a verified login is remembered for ``LOGIN_CACHE_S``. Written readable
    by its owner only (it holds the admin's password)."""
    from trainyard.files import atomic_write

    text = (
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = {database_uri}\n"
        f"admin_username = {service_user}\n"
        f"admin_password = {service_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "grant_default_workspace_access = false\n"
        f"auth_cache_ttl_seconds = {LOGIN_CACHE_S}\n"
    )
    atomic_write(path, text.encode())  # mode 0600
    return path


def server_env(config: Path, secret_key: str) -> dict[str, str]:
    """What ``mlflow server --app-name basic-auth`` is started with: :func:`write_config`'s file, and the key
    that signs its forms' CSRF tokens (the same for every worker of the server)."""
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": secret_key}


def _client():
    from mlflow.server.auth.client import AuthServiceClient

    return AuthServiceClient(paths.mlflow_tracking_uri())


def _already(err: Exception) -> bool:
    return getattr(err, "error_code", "") == "RESOURCE_ALREADY_EXISTS"


def _role_ids(auth, teams) -> dict[str, int]:
    """Each of ``teams``' role id, each role made where missing."""
    from mlflow.exceptions import MlflowException

    have = {r.name: r.id for r in auth.list_roles(WORKSPACE)}
    ids = {}
    for team in teams:
        name = role_name(team)
        if name not in have:
            try:
                have[name] = auth.create_role(WORKSPACE, name, f"members of trainyard team {team}: read its work").id
            except MlflowException as err:  # made at once by another process
                if not _already(err):
                    raise
                have = {r.name: r.id for r in auth.list_roles(WORKSPACE)}
        ids[team] = have[name]
    return ids


def _grant(auth, role_id: int, resource_type: str, resource: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        auth.add_role_permission(role_id, resource_type, resource, READ)
    except MlflowException as err:
        if not _already(err):
            raise


def grant_team_read(team: str, *, experiment_id: str | None = None, model: str | None = None) -> None:
    """Let ``team``'s members read experiment ``experiment_id`` (its runs with it) or registered model
    ``model`` (its versions with it); nothing where MLflow's auth app is not in use."""
    if not enabled():
        return
    auth = _client()
    role = _role_ids(auth, [team])[team]
    if experiment_id is not None:
        _grant(auth, role, "experiment", experiment_id)
    if model is not None:
        _grant(auth, role, "registered_model", model)


def _every(search):
    """Every item of an MLflow search, page by page."""
    token = None
    while True:
        page = search(max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


@dataclass(frozen=True)
class Login:
    """An Airflow user as MLflow is told of them: password and whether an admin."""

    password: str
    admin: bool = False


def sync(c, teams: list[str], teams_of: Mapping[str, list[str]], logins: Mapping[str, Login]) -> dict[str, list[str]]:
    """Make MLflow's users, roles and grants say what Airflow and ``resources.yaml`` say: a role for each of
    ``teams`` (every team of the file); every user of ``logins`` with that password and admin flag, holding
    the roles of exactly their teams (``teams_of``: user -> teams; a trainyard role of a team no longer
    theirs, or no longer listed, is taken away); and each team's experiments and models granted READ to its
    role by their owner tags (read with the MLflow client ``c``). Returns each user's teams, as set."""
    from mlflow.exceptions import MlflowException

    from trainyard.files import atomic_write

    service = os.environ.get(SERVICE_USER_ENV)
    if service in logins:
        raise ValueError(f"an Airflow user is named {service!r}, the tracking server's service account: rename it")
    auth = _client()
    roles = _role_ids(auth, teams)
    synced = paths.home() / "mlflow" / "synced_users.json"  # who the last sync gave an account
    for gone in sorted(set(json.loads(synced.read_text()) if synced.exists() else []) - set(logins)):
        try:  # a user Airflow no longer has: no account, so no team's role
            auth.delete_user(gone)
        except MlflowException as err:
            if getattr(err, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                raise
    atomic_write(synced, json.dumps(sorted(logins)).encode())
    for user, login in sorted(logins.items()):
        try:
            auth.create_user(user, login.password)
        except MlflowException as err:
            if not _already(err):
                raise
            auth.update_user_password(user, login.password)
        auth.update_user_admin(user, login.admin)
        held = {r.name: r.id for r in auth.list_user_roles(user) if r.name.startswith(ROLE_PREFIX)}
        wanted = {role_name(t): roles[t] for t in teams_of.get(user, []) if t in roles}
        for name, role_id in held.items():
            if name not in wanted:
                auth.unassign_role(user, role_id)
        for name, role_id in wanted.items():
            if name not in held:
                auth.assign_role(user, role_id)
    found = [("experiment", e.experiment_id, e.name, e.tags or {}) for e in _every(c.search_experiments)]
    found += [("registered_model", m.name, m.name, m.tags or {}) for m in _every(c.search_registered_models)]
    owned: list[tuple[str, str, str, str, Mapping[str, str]]] = []  # (type, resource, name, owner, tags)
    for resource_type, resource, name, tags in found:
        owner = tags.get(TEAM_TAG)
        if owner is not None and owner in roles:
            owned.append((resource_type, resource, name, owner, tags))
    # (role, resource type, resource): what the owner tags say
    wanted_grants = {(roles[owner], resource_type, resource) for resource_type, resource, _, owner, _ in owned}
    for _, resource_type, resource in wanted_grants:  # no user keeps a maker's rights: only their teams' roles
        for user, login in logins.items():
            if not login.admin:
                try:
                    auth.revoke_user_permission(user, resource_type, resource)
                except MlflowException as err:
                    if getattr(err, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                        raise
    for resource_type, resource, name, owner, tags in owned:  # sealed once nobody holds a maker's rights
        mark = seal(resource_type, name, owner)
        if mark is not None and tags.get(SEAL_TAG) != mark:
            set_tag = c.set_experiment_tag if resource_type == "experiment" else c.set_registered_model_tag
            set_tag(resource, SEAL_TAG, mark)
    for role_id in roles.values():  # a model given to another team: its team before reads it no longer
        for granted in auth.list_role_permissions(role_id):
            if (role_id, granted.resource_type, granted.resource_pattern) not in wanted_grants:
                auth.remove_role_permission(granted.id)
    for role_id, resource_type, resource in sorted(wanted_grants):
        _grant(auth, role_id, resource_type, resource)
    return {user: sorted(teams_of.get(user, [])) for user in sorted(logins)}
