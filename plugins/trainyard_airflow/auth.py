"""Who a user is to Airflow, as trainyard's team checks (:mod:`trainyard.teams`) need it: whether they are an
admin, who the admins are. Read from the auth manager's own configuration; an auth manager trainyard cannot
read admits no admin here (fail closed): list such users as promoters of the teams they act for."""

from __future__ import annotations

SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"


def admins() -> list[str]:
    """The users whose Airflow role is ``admin`` (the simple auth manager's ``[core]
    simple_auth_manager_users``, ``name:role[:teams]``); [] under another auth manager."""
    from airflow.configuration import conf

    if conf.get("core", "auth_manager", fallback=SIMPLE_AUTH_MANAGER) != SIMPLE_AUTH_MANAGER:
        return []
    users = [entry.split(":") for entry in conf.getlist("core", "simple_auth_manager_users", fallback="")]
    return sorted(fields[0] for fields in users if len(fields) >= 2 and fields[1].strip().lower() == "admin")


def is_admin(user: str | None) -> bool:
    """Whether ``user`` is an Airflow admin (every user is, with the simple auth manager's
    ``simple_auth_manager_all_admins``, a development mode); a run no person triggered (None) is not."""
    from airflow.configuration import conf

    if user is None:
        return False
    return conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False) or user in admins()
