"""Which team owns a dataset repository: the repository metadata key :data:`OWNER_KEY`, written with the
repository (the local store writes both in one file; lakeFS in the request after its creation).

* A repository made by an upload (``trainyard data upload``, ``ingest_dataset.<team>``) belongs to the
  uploading team: only its jobs read it, only its members upload to it or tag it.
* A repository made by a built-in source (``dataset.source``: scikit-learn's digits, the generated shapes,
  photos and sentence pairs) holds public data: it is every team's to read (:data:`EVERY_TEAM`), it records the
  source (:data:`SOURCE_KEY`), and nothing but that source's own ingest writes to it. So every team's
  default job trains on the one ``digits`` repository, and no team can slip its files into it.

Who may read and write is decided in :mod:`trainyard.teams`; this module only reads and records owners.
A repository made before trainyard recorded owners has none; it is refused until an admin names its owner
(``trainyard data owner``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.data.store import StoreError
from trainyard.errors import PermanentError, RetryableError

OWNER_KEY = "trainyard.team"
SOURCE_KEY = "trainyard.source"  # the built-in source a public repository holds
EVERY_TEAM = "*"  # the owner of a public repository


class NoOwner(PermanentError):
    """A dataset repository with no owning team recorded."""


@dataclass(frozen=True)
class RepoOwner:
    """Whose a repository is: a team, or :data:`EVERY_TEAM` for one holding the built-in ``source``."""

    team: str
    source: str | None = None

    @property
    def public(self) -> bool:
        return self.team == EVERY_TEAM

    def describe(self) -> str:
        return f"every team's (built-in source {self.source})" if self.public else f"team {self.team}'s"


def _metadata(team: str, source: str | None) -> dict[str, str]:
    return {OWNER_KEY: EVERY_TEAM, SOURCE_KEY: source} if source else {OWNER_KEY: team}


def owner(store, repo: str) -> RepoOwner | None:
    """The owner of ``repo`` (a read: nothing is written); None when there is no such repository. NoOwner
    when it exists without one (made before owners were recorded, or by another tool)."""
    if not store.repo_exists(repo):
        return None
    return _recorded(store, repo) or _no_owner(store, repo)


def _recorded(store, repo: str) -> RepoOwner | None:
    meta = store.repo_metadata(repo)
    return RepoOwner(meta[OWNER_KEY], meta.get(SOURCE_KEY) or None) if meta.get(OWNER_KEY) else None


def _no_owner(store, repo: str) -> RepoOwner:
    raise NoOwner(
        f"dataset repository {repo!r} ({store.kind} store) has no owning team recorded (it was made before trainyard "
        f"recorded owners, or outside trainyard): an admin names one with `trainyard data owner --store {store.kind} "
        f"--repo {repo} TEAM` (or `--source SOURCE` for a built-in source's public data)"
    )


def claim(store, repo: str, team: str, *, source: str | None = None, default_branch: str = "main") -> RepoOwner:
    """Make sure ``repo`` exists and say whose it is: created as ``team``'s when there is none, or as every
    team's when it is made for the built-in ``source``. Of two creators at once, one creates it and the
    other finds it owned."""
    raced = False  # another creator made it between our look and our creation
    if not store.repo_exists(repo):
        try:
            store.create_repo(repo, default_branch=default_branch, metadata=_metadata(team, source))
        except StoreError:
            if not store.repo_exists(repo):
                raise
            raced = True
    found = _recorded(store, repo)
    if found is None and raced and store.kind == "lakefs":  # lakeFS: its maker writes the owner a moment later
        raise RetryableError(f"dataset repository {repo!r} has no owner recorded yet; it is being created")
    return found or _no_owner(store, repo)


def set_owner(store, repo: str, team: str, *, source: str | None = None, replace: bool = False) -> RepoOwner | None:
    """Record ``team`` (or, with ``source``, every team) as the owner of ``repo`` (an admin's act); the
    owner before, if any. An owner already recorded is changed only with ``replace``."""
    if not store.repo_exists(repo):
        raise StoreError(f"dataset repository {repo!r} does not exist in the {store.kind} store")
    before = _recorded(store, repo)
    after = RepoOwner(EVERY_TEAM, source) if source else RepoOwner(team)
    if before and before != after and not replace:
        raise PermanentError(
            f"dataset repository {repo!r} is {before.describe()}; pass --replace to make it {after.describe()}"
        )
    store.set_repo_metadata(repo, {SOURCE_KEY: "", **_metadata(team, source)})
    return before
