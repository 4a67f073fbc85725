"""Who a user is to Airflow, as trainyard's team checks (:mod:`trainyard.teams`) need it: whether they are an
admin, who the admins are. Read from the auth manager's own configuration; an auth manager trainyard cannot
read admits no admin here (fail closed): list such users as promoters of the teams they act for.

And the checks of an alias move with those facts filled in, for every task of ``promote_model`` that makes
one: :func:`authorize_move` (the requester) and :func:`check_approver` (the approver), each reading the
model's owner and the team policy where they live, never from an XCom (which users may write)."""

from __future__ import annotations

SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
# the simple auth manager with teams from resources.yaml (trainyard_airflow.auth_manager): the same users
SIMPLE_AUTH_MANAGERS = (SIMPLE_AUTH_MANAGER, "trainyard_airflow.auth_manager.TeamsFromResourcesAuthManager")


def triggering_user() -> str | None:
    """The Airflow user who triggered the current task's run (the UI, REST, the ``trainyard`` command); None
    for a run no person triggered (a schedule, an asset event)."""
    from airflow.sdk import get_current_context

    return getattr(get_current_context()["dag_run"], "triggering_user_name", None) or None


def admins() -> list[str]:
    """The users whose Airflow role is ``admin`` (the simple auth manager's ``[core]
    simple_auth_manager_users``, ``name:role[:teams]``); [] under another auth manager."""
    from airflow.configuration import conf

    if conf.get("core", "auth_manager", fallback=SIMPLE_AUTH_MANAGER) not in SIMPLE_AUTH_MANAGERS:
        return []
    return sorted(user for user, role in _simple_users().items() if role == "admin")


def _simple_users() -> dict[str, str]:
    """The simple auth manager's users and their roles (``[core] simple_auth_manager_users``, ``name:role``)."""
    from airflow.configuration import conf

    users = [entry.split(":") for entry in conf.getlist("core", "simple_auth_manager_users", fallback="")]
    return {fields[0].strip(): fields[1].strip().lower() for fields in users if len(fields) >= 2}


def logins() -> dict:
    """Each Airflow user of the simple auth manager as MLflow's auth app is told of them
    (:class:`trainyard.tracking.mlflow_auth.Login`): the password Airflow generated for them (its passwords
    file, written by the api-server's first start) and whether an admin. {} under another auth manager."""
    import json
    from pathlib import Path

    from airflow.configuration import conf

    from trainyard.tracking.mlflow_auth import Login

    if conf.get("core", "auth_manager", fallback=SIMPLE_AUTH_MANAGER) not in SIMPLE_AUTH_MANAGERS:
        return {}
    passwords_file = Path(conf.get("core", "simple_auth_manager_passwords_file"))
    passwords = json.loads(passwords_file.read_text()) if passwords_file.exists() else {}
    return {
        user: Login(passwords[user], role == "admin") for user, role in _simple_users().items() if user in passwords
    }


def is_admin(user: str | None) -> bool:
    """Whether ``user`` is an Airflow admin (every user is, with the simple auth manager's
    ``simple_auth_manager_all_admins``, a development mode); a run no person triggered (None) is not."""
    from airflow.configuration import conf

    if user is None:
        return False
    return conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False) or user in admins()


def owning_team(model: str):
    """(the resources in force, the team that owns ``model``); NotFoundError when there is no such model."""
    from trainyard.errors import NotFoundError
    from trainyard.registry import ownership
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.tracking.mlflow_tracking import client

    owner = ownership.owner(client(), model)
    if owner is None:
        raise NotFoundError(f"no registered model {model!r}")
    return resources_in_force(), owner


def authorize_move(model: str, requester: str | None, dag_team: str | None = None):
    """:func:`owning_team`, once ``requester`` is found allowed to move ``model``'s aliases, in the
    promotion DAG of ``dag_team`` (None: the one of every team), NotAllowed naming who may and where."""
    from trainyard import teams

    config, owner = owning_team(model)
    teams.check_alias_move(config, model, owner, requester, admin=is_admin(requester))
    teams.check_model_dag(model, owner, dag_team)
    return config, owner


def check_approver(model: str, requester: str | None, approver: str | None) -> None:
    """NotAllowed unless ``approver`` may approve ``requester``'s move of an alias of ``model``."""
    from trainyard import teams

    config, owner = owning_team(model)
    teams.check_approval(config, model, owner, str(requester), approver, admin=is_admin(approver))
