"""Which team owns a registered model: the tag :data:`OWNER_TAG` on the registered model in MLflow, set when
the model is created (in the same request, so no other team can slip in between) by the team whose job first
registers it. Who may add versions or move aliases is decided in :mod:`trainyard.teams`.

A model registered before trainyard recorded owners has no such tag; its owner is the team its first
version's lineage names (the version tag ``team``, written by every registration), recorded on first use.
One with neither is refused until an admin names its owner (``trainyard models owner``).
"""

from __future__ import annotations

from trainyard.errors import PermanentError, RetryableError
from trainyard.tracking.mlflow_auth import TEAM_TAG

OWNER_TAG = TEAM_TAG
VERSION_TEAM_TAG = "team"  # the team of the run that registered a version (its lineage)


class NoOwner(PermanentError):
    """A registered model with no owning team recorded and none to infer."""


def owner(client, name: str) -> str | None:
    """The team that owns registered model ``name`` (a read: nothing is written); None when no such model
    exists. NoOwner when it exists but neither its tag nor its first version names a team."""
    return _owner(client, name)[0]


def _owner(client, name: str) -> tuple[str | None, bool]:
    """(:func:`owner`, whether it is recorded on the model rather than inferred from its lineage)."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None, False
        raise
    team = (model.tags or {}).get(OWNER_TAG)
    if team:
        return team, True
    team = _first_version_team(client, name)  # the same answer for every caller: its lineage
    if team is None:
        raise NoOwner(
            f"model {name!r} has no owning team recorded (it was made outside trainyard): an admin names one with "
            f"`trainyard models owner {name} TEAM`"
        )
    return team, False


def _first_version_team(client, name: str) -> str | None:
    from trainyard.tracking.mlflow_tracking import quote

    found = client.search_model_versions(f"name = {quote(name)}", max_results=1, order_by=["version_number ASC"])
    return (found[0].tags or {}).get(VERSION_TEAM_TAG) if found else None


def claim(client, name: str, team: str) -> str:
    """Make sure registered model ``name`` exists and say who owns it: created owned by ``team`` when there is
    none (one request: of two teams creating it at once, one creates it and the other finds it owned)."""
    from mlflow.exceptions import MlflowException

    from trainyard.tracking import mlflow_auth

    try:
        client.create_registered_model(
            name,
            tags=mlflow_auth.sealed("registered_model", name, team),
            description=f"trained and registered by trainyard; owned by team {team}",
        )
        mlflow_auth.grant_team_read(team, model=name)  # its members read it in MLflow, where MLflow enforces it
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    found, recorded = _owner(client, name)
    if found is None:  # deleted between the two calls: a retry makes it again
        raise RetryableError(f"model {name!r} was deleted while it was being registered")
    if not recorded:
        client.set_registered_model_tag(name, OWNER_TAG, found)  # inferred from its lineage: recorded now
        mlflow_auth.grant_team_read(found, model=name)
    if found == team:  # the model a version goes into: made by trainyard, so nobody holds a maker's rights
        mlflow_auth.check_sealed("registered_model", name, team, client.get_registered_model(name).tags or {})
    return found


def set_owner(client, name: str, team: str, *, replace: bool = False) -> str | None:
    """Record ``team`` as the owner of ``name`` (an admin's act), and of the experiment of the same name (its
    runs: job and model names are one namespace); the owner before, if any. An owner already recorded is
    changed only with ``replace``."""
    before = (client.get_registered_model(name).tags or {}).get(OWNER_TAG)
    if before and before != team and not replace:
        raise PermanentError(f"model {name!r} belongs to team {before!r}; pass --replace to give it to {team!r}")
    from trainyard.tracking import mlflow_auth

    for key, value in mlflow_auth.sealed("registered_model", name, team).items():  # the owner, and its seal
        client.set_registered_model_tag(name, key, value)

    mlflow_auth.grant_team_read(team, model=name)  # the team before reads it until `mlflow_auth.sync` runs
    experiment = client.get_experiment_by_name(name)  # the job name's runs go with it: one namespace
    if experiment is not None:
        for key, value in mlflow_auth.sealed("experiment", name, team).items():
            client.set_experiment_tag(experiment.experiment_id, key, value)
        mlflow_auth.grant_team_read(team, experiment_id=experiment.experiment_id)
    return before


def owner_or_none(client, name: str) -> str | None:
    """:func:`owner`, or None where none is recorded or inferred: for what only shows it."""
    try:
        return owner(client, name)
    except NoOwner:
        return None
