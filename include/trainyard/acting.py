"""Who a ``trainyard`` command acts as, and which teams' work it may read: the user of the command line's
Airflow login (as the API server says, ``GET /ui/auth/me``: never a name typed on the command line), the
teams ``resources.yaml`` lists them in, and whether they are an Airflow admin (every team's).

Every command that reads or writes a team's runs, models or datasets asks here (``runs list|compare``,
``show``, ``models card|history|live-at|verify|owner``, ``data``, ``queue``). Without a login a command
acts as nobody: it reads what is every team's (a built-in source's public data, the queue's redacted view).
This confines the command; it is not a boundary against a user who can read ``$TRAINYARD_HOME`` or the
MLflow store directly (see the security table of docs/security.md for what is).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.teams import NotAllowed


@dataclass(frozen=True)
class Acting:
    """A command's acting user (None: nobody logged in), their teams, and whether they are an admin."""

    user: str | None = None
    teams: tuple[str, ...] = ()
    admin: bool = False

    def may_read(self, team: str | None) -> bool:
        """Whether this user may read the work of ``team`` (None: work of no team, everyone's)."""
        return team is None or self.admin or team in self.teams

    @classmethod
    def of(cls, user: str, role: str) -> Acting:
        """An Airflow user of ``role``: their teams are those the members lists of the resources in force
        give them; an admin's (the role ``admin``, in any case) every team."""
        from trainyard.scheduling.resources import resources_in_force
        from trainyard.teams import teams_of

        return cls(user, tuple(teams_of(resources_in_force(), user)), role.lower() == "admin")

    def who(self) -> str:
        return (
            "nobody logged in"
            if self.user is None
            else f"user {self.user!r} (teams: {', '.join(self.teams) or 'none'})"
        )

    def check_model(self, c, model: str) -> None:
        """Refuse reading registered model ``model`` (client ``c``) unless this user may read its owning
        team's work; one with no owner recorded or inferred, unless an admin (who names one)."""
        from trainyard.registry.ownership import NoOwner, owner

        try:
            team = owner(c, model)
        except NoOwner:
            if self.admin:
                return
            raise
        self._check_team(model, team)

    def _check_team(self, model: str, owner: str | None) -> None:
        if not self.may_read(owner):
            raise NotAllowed(
                f"model {model!r} belongs to team {owner!r}; {self.who()} may not read it: log in as a member of "
                f"team {owner!r} (AIRFLOW_API_TOKEN) or an Airflow admin"
            )


def acting(*, required: bool = False) -> Acting:
    """Who the command line's Airflow login is: nobody without one (CommandError where ``required``, saying
    how to give one); CommandError where the API server refuses it."""
    from trainyard.airflow_api import find_login, require_login, whoami

    login = require_login() if required else find_login()
    if login is None:
        return Acting()
    caller = whoami(login)
    return Acting.of(caller.user, caller.role)
