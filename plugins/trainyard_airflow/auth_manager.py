"""Airflow's simple auth manager with each user's teams read from ``resources.yaml``.

In multi-team mode (``[core] multi_team``) Airflow shows a team's DAGs, their runs, task logs, XComs and
approvals only to the team's users and admins; the simple auth manager would take a user's teams from
``[core] simple_auth_manager_users`` (``name:role:team1|team2``), a second list of who is in which team
beside ``resources.yaml``'s ``members``, the one trainyard's own checks read. This one reads the members
only: a user's teams are the teams of the resources in force (:func:`trainyard.teams.teams_of`) when a
request arrives, so an edit of ``members`` holds at the next request, without a new login or a restart.
Users and roles stay where the simple auth manager keeps them (``name:role``).
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser


def _teams(user: str) -> list[str]:
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import teams_of

    return teams_of(resources_in_force(), user)


class TeamsFromResourcesAuthManager(SimpleAuthManager):
    @staticmethod
    def get_users() -> list[SimpleAuthManagerUser]:
        return [
            SimpleAuthManagerUser(username=u.username, role=u.role, teams=_teams(u.username))
            for u in SimpleAuthManager.get_users()
        ]

    def _get_teams(self) -> set[str]:
        """The users' teams that Airflow knows (``airflow teams sync``): Airflow refuses to start where
        the auth manager names a team its database lacks, as a team just added to resources.yaml is until
        ``make setup`` made its bundle; meanwhile it gives nobody access to anything."""
        from airflow.models.team import Team

        return super()._get_teams() & set(Team.get_all_team_names())

    def deserialize_user(self, token: dict[str, Any]) -> SimpleAuthManagerUser:
        """The token's user and role (Airflow signed them), with the teams the members lists give now."""
        user = super().deserialize_user(token)
        return SimpleAuthManagerUser(username=user.username, role=user.role, teams=_teams(user.username))
