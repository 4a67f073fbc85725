"""Team access to dataset repositories: the owners :mod:`trainyard.data.ownership` records, checked by the
team policy of :mod:`trainyard.teams`, for every entry that reads or writes a repository: a job's data
step, an upload (``trainyard data upload``, ``ingest_dataset``) and the ``trainyard data`` commands.
"""

from __future__ import annotations

from trainyard.data import ownership
from trainyard.data.ownership import RepoOwner
from trainyard.spec import JobSpec
from trainyard.teams import NotAllowed, check_dataset_read, check_dataset_write


def check_job_access(store, spec: JobSpec) -> None:
    """Refuse a job whose team may not read its dataset repository, or may not ingest its built-in source
    into it. A repository that does not exist yet is made here when the job names a source (owned as
    :func:`ownership.claim` says); one with no source to make it from is left to the store to report."""
    ds, team = spec.dataset, spec.resources.team
    source = None if ds.source == "none" else ds.source
    found = ownership.claim(store, ds.repo, team, source=source) if source else ownership.owner(store, ds.repo)
    if found is None:
        return
    check_dataset_read(ds.repo, found.team, [team], public=found.public)
    if source:
        _check_write(ds.repo, found, team, source)


def check_upload(store, repo: str, team: str) -> None:
    """Refuse team ``team`` uploading to ``repo`` unless it is the team's own or does not exist yet (a
    check before the work of validating; :func:`upload` checks again as it commits)."""
    found = ownership.owner(store, repo)
    if found is not None:
        _check_write(repo, found, team)


def upload(store, repo: str, branch: str, folder, team: str, *, metadata: dict | None = None, **kwargs) -> dict:
    """:func:`trainyard.data.upload.upload_folder` as team ``team``: into a repository of its own (made as
    the team's when there is none), the team recorded on the commit."""
    from trainyard.data.upload import upload_folder

    found = ownership.claim(store, repo, team, default_branch=branch)
    _check_write(repo, found, team)
    return upload_folder(store, repo, branch, folder, metadata={**(metadata or {}), "team": team}, **kwargs)


def check_read(store, repo: str, teams: list[str], *, admin: bool) -> RepoOwner | None:
    """Refuse one acting as ``teams`` (``admin``: every team) reading ``repo``; its owner, None where there
    is no such repository (the read then fails with the store's own message)."""
    found = ownership.owner(store, repo)
    if found is not None:
        check_dataset_read(repo, found.team, teams, public=found.public, admin=admin)
    return found


def check_tag(store, repo: str, teams: list[str], *, admin: bool) -> None:
    """Refuse one acting as ``teams`` (``admin``: every team) tagging in ``repo``: a team's own repository
    only; a public one's refs only an admin changes."""
    found = check_read(store, repo, teams, admin=admin)
    if found is not None and found.public and not admin:
        raise NotAllowed(
            f"dataset repository {repo!r} holds the built-in source {found.source!r}, shared by every team: only an "
            "Airflow admin tags in it; tag a repository of your own team"
        )


def _check_write(repo: str, found: RepoOwner, team: str, source: str | None = None) -> None:
    """:func:`trainyard.teams.check_dataset_write` with the facts of ``found``: an upload (``source`` None)
    or a built-in ``source``'s ingest by ``team``."""
    check_dataset_write(repo, found.team, team, public=found.public, repo_source=found.source, source=source)
