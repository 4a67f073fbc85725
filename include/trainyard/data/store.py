"""Versioned dataset stores: the DatasetStore protocol and the embedded local store.

The local store keeps lakeFS's semantics on a plain directory:

- repositories hold content-addressed blobs (``objects/ab/cdef...`` named by their SHA-256); two writers
  of the same blob write the same bytes, so whichever rename lands last changes nothing;
- uploads land in the writer's own staging area (one per ``LocalStore`` object: a writer is one object,
  so two processes never commit each other's uploads); ``commit`` turns that staging + the branch head
  into a new commit; ``commit_files`` does both in one call;
- commits on a branch are serialised: the head is read, the new commit built on it and the ref moved
  while holding an exclusive ``fcntl.flock`` on ``locks/branch.<name>.lock``, and the ref is moved by a
  compare-and-swap that raises ``Conflict`` if the head is no longer the one the commit was built on
  (a writer that bypassed the lock). So every commit that returns is in the branch's history and holds
  exactly its parent's tree plus its writer's changes;
- a commit id is the SHA-256 of its content (tree, parents, message, metadata), so equal content gives
  equal ids; the wall-clock time is recorded beside it, not hashed;
- branches and tags are refs; every ref update is a write to a temp file then ``os.replace``, so a crash
  leaves the previous state intact; creating a repository, branch or tag is create-if-absent under a lock,
  so of two concurrent creators one wins and the other is told it exists; a repository's metadata (its
  owning team, :mod:`trainyard.data.ownership`) is written with it, in the same file;
- every read verifies the blob's checksum.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from trainyard.errors import NotFoundError, PermanentError, RetryableError, TrainyardError
from trainyard.files import atomic_write, file_lock

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{64}$")


class StoreError(TrainyardError):
    """Any refused or failed store operation; the message says which repo/ref/path."""


class NotFound(StoreError, NotFoundError):
    pass


class Corrupt(StoreError, PermanentError):
    pass


class Conflict(StoreError, RetryableError):
    """The branch moved under a commit (another writer won the race): retrying re-reads the head."""

    retryable = True


class Unavailable(StoreError, RetryableError):
    """The store could not be reached; a retry may succeed."""

    retryable = True


@dataclass(frozen=True)
class Entry:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Commit:
    id: str
    parents: tuple[str, ...]
    message: str
    metadata: dict
    created_at: float


class DatasetStore(Protocol):
    """What every backend (local, lakeFS) offers. Paths are POSIX, relative to the repo root.

    ``commit_files`` is the one call for a writer that shares the branch with others: it stages and
    commits atomically, so concurrent callers each get a commit holding exactly their own files (on top of
    the head they were committed on, or alone with ``replace``), and every such commit stays in the
    branch's history. ``upload``/``commit`` stage first; their staging is only private in LocalStore."""

    kind: str

    def create_repo(
        self, repo: str, default_branch: str = "main", metadata: Mapping[str, str] | None = None
    ) -> None: ...
    def repo_exists(self, repo: str) -> bool: ...
    def repo_metadata(self, repo: str) -> dict[str, str]: ...
    def set_repo_metadata(self, repo: str, metadata: Mapping[str, str]) -> None: ...
    def upload(self, repo: str, branch: str, path: str, data: bytes) -> Entry: ...
    def commit(self, repo: str, branch: str, message: str, metadata: Mapping[str, str] | None = None) -> Commit: ...
    def commit_files(
        self,
        repo: str,
        branch: str,
        files: Mapping[str, bytes],
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        replace: bool = False,
    ) -> Commit: ...
    def resolve(self, repo: str, ref: str) -> str: ...
    def read(self, repo: str, ref: str, path: str) -> bytes: ...
    def list(self, repo: str, ref: str, prefix: str = "") -> list[Entry]: ...
    def tag(self, repo: str, tag: str, ref: str) -> str: ...
    def get_commit(self, repo: str, ref: str) -> Commit: ...


def check_path(path: str) -> str:
    """Normalise a repo-relative path, refusing absolute paths and traversal."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("..", "") for part in p.parts) or "\\" in path:
        raise StoreError(f"invalid path {path!r}: must be relative, without '..'")
    return p.as_posix()


def _check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name):
        raise StoreError(f"invalid {kind} name {name!r}: letters, digits, '.', '_' or '-', at most 63")
    return name


def publish_dir(tmp: Path, dest: Path) -> Path:
    """Rename the finished directory ``tmp`` to ``dest``; if another process published ``dest`` first, keep
    theirs and drop ``tmp``. Caches filled this way are immutable and keyed by their inputs, so the two
    copies are equal, and ``dest`` only ever appears complete (a rename of a finished directory)."""
    try:
        os.rename(tmp, dest)  # never os.replace: it would swap out a directory a reader may be using
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not dest.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def ensure_repo(store, repo: str, default_branch: str = "main", metadata: Mapping[str, str] | None = None) -> None:
    """Create ``repo`` (with ``metadata``) unless it exists; a concurrent creator winning the race is success
    too (its metadata then stands)."""
    if store.repo_exists(repo):
        return
    try:
        store.create_repo(repo, default_branch=default_branch, metadata=metadata)
    except StoreError:
        if not store.repo_exists(repo):
            raise


def ingest_files(
    store, repo: str, branch: str, files: Mapping[str, bytes], message: str, metadata: Mapping[str, str]
) -> Commit:
    """Commit a built-in dataset's files to ``repo``/``branch`` (created if missing). Identical content
    commits nothing new, so the same bytes always pin the same commit id."""
    ensure_repo(store, repo, branch)
    return store.commit_files(repo, branch, files, message=message, metadata=metadata)


def generator_metadata(module: str, params: Mapping[str, object]) -> dict[str, str]:
    """A generated dataset's commit metadata: the module that generated it and the parameters it was given."""
    return {"source": module, **{k: str(v) for k, v in params.items()}}


def tree_digest(entries: Iterable[Entry]) -> str:
    """Digest of a tree's content (paths and blob hashes): the data's identity, independent of history."""
    return hashlib.sha256(_canonical(sorted((e.path, e.sha256) for e in entries))).hexdigest()


class LocalStore:
    """The embedded store: a directory per repository under ``root``. One object is one writer: its
    staged uploads are its own until it commits them."""

    kind = "local"

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        # (repo, branch) -> path -> {"sha256", "size"} or None (a staged delete). In memory because a
        # writer's staging dies with the writer; the blobs it points at are already on disk.
        self._staging: dict[tuple[str, str], dict[str, dict | None]] = {}

    # -- layout -------------------------------------------------------------------------------------
    def _repo(self, repo: str) -> Path:
        path = self.root / _check_name("repository", repo)
        if not (path / "repo.json").exists():
            raise NotFound(f"repository {repo!r} does not exist in {self.root}")
        return path

    def _blob_path(self, repo_dir: Path, sha: str) -> Path:
        return repo_dir / "objects" / sha[:2] / sha[2:]

    def _branch_lock(self, repo_dir: Path, branch: str):
        return file_lock(repo_dir / "locks" / f"branch.{branch}.lock")

    # -- repositories and branches ----------------------------------------------------------------
    def _repo_lock(self, repo: str):
        return file_lock(self.root / ".locks" / f"{repo}.lock")

    def create_repo(self, repo: str, default_branch: str = "main", metadata: Mapping[str, str] | None = None) -> None:
        path = self.root / _check_name("repository", repo)
        _check_name("branch", default_branch)
        # Under a lock per repository name: a second creator must not reset the branch ref the first
        # one's writer has already committed to, nor its metadata.
        with self._repo_lock(repo):
            if (path / "repo.json").exists():
                raise StoreError(f"repository {repo!r} already exists")
            atomic_write(path / "refs" / "branches" / default_branch, b"")
            info = {"default_branch": default_branch, "created_at": time.time(), "metadata": dict(metadata or {})}
            atomic_write(path / "repo.json", _canonical(info))

    def repo_exists(self, repo: str) -> bool:
        return (self.root / _check_name("repository", repo) / "repo.json").exists()

    def repo_metadata(self, repo: str) -> dict[str, str]:
        return dict(json.loads((self._repo(repo) / "repo.json").read_bytes()).get("metadata", {}))

    def set_repo_metadata(self, repo: str, metadata: Mapping[str, str]) -> None:
        """Set the keys of ``metadata`` on ``repo`` (the others stay)."""
        with self._repo_lock(repo):
            info_file = self._repo(repo) / "repo.json"
            info = json.loads(info_file.read_bytes())
            info["metadata"] = {**info.get("metadata", {}), **{k: str(v) for k, v in metadata.items()}}
            atomic_write(info_file, _canonical(info))

    def create_branch(self, repo: str, branch: str, source: str) -> str:
        repo_dir = self._repo(repo)
        ref = repo_dir / "refs" / "branches" / _check_name("branch", branch)
        commit = self.resolve(repo, source)
        with self._branch_lock(repo_dir, branch):
            if ref.exists():
                raise StoreError(f"branch {branch!r} already exists in {repo!r}")
            atomic_write(ref, commit.encode())
        return commit

    def _branch_head(self, repo_dir: Path, branch: str) -> str | None:
        ref = repo_dir / "refs" / "branches" / _check_name("branch", branch)
        if not ref.exists():
            raise NotFound(f"branch {branch!r} does not exist in {repo_dir.name!r}")
        return ref.read_text().strip() or None

    # -- writing ------------------------------------------------------------------------------------
    def _put_blob(self, repo_dir: Path, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        blob = self._blob_path(repo_dir, sha)
        if not blob.exists():
            atomic_write(blob, data)
        return sha

    def _put_blobs(self, repo: str, branch: str, files: Mapping[str, bytes]) -> tuple[Path, dict[str, dict]]:
        """Write the blobs (every path checked first); the branch must exist."""
        repo_dir = self._repo(repo)
        self._branch_head(repo_dir, branch)
        items = [(check_path(p), d) for p, d in files.items()]
        return repo_dir, {p: {"sha256": self._put_blob(repo_dir, d), "size": len(d)} for p, d in items}

    def upload(self, repo: str, branch: str, path: str, data: bytes) -> Entry:
        return self.upload_many(repo, branch, {path: data})[0]

    def upload_many(self, repo: str, branch: str, files: Mapping[str, bytes]) -> list[Entry]:
        """Stage many files in this writer's staging (blobs first, so staging never dangles)."""
        _, written = self._put_blobs(repo, branch, files)
        self._staging.setdefault((repo, branch), {}).update(written)
        return [Entry(p, e["sha256"], e["size"]) for p, e in written.items()]

    def delete(self, repo: str, branch: str, path: str) -> None:
        self._branch_head(self._repo(repo), branch)
        self._staging.setdefault((repo, branch), {})[check_path(path)] = None

    def commit(self, repo: str, branch: str, message: str, metadata: Mapping[str, str] | None = None) -> Commit:
        """Commit this writer's staged changes. With nothing staged (or staging equal to the head) it
        returns the head unchanged, so re-ingesting identical data pins the same commit."""
        repo_dir = self._repo(repo)
        staged = self._staging.get((repo, branch), {})
        commit = self._commit_changes(repo_dir, branch, staged, False, message, metadata)
        self._staging.pop((repo, branch), None)  # only once committed: a failed commit keeps the staging
        return commit

    def commit_files(
        self,
        repo: str,
        branch: str,
        files: Mapping[str, bytes],
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        replace: bool = False,
    ) -> Commit:
        """Commit ``files`` on top of the branch head in one step (``replace``: as the whole tree), without
        touching this writer's staging."""
        repo_dir, written = self._put_blobs(repo, branch, files)
        return self._commit_changes(repo_dir, branch, written, replace, message, metadata)

    def _commit_changes(
        self,
        repo_dir: Path,
        branch: str,
        changes: Mapping[str, dict | None],
        replace: bool,
        message: str,
        metadata: Mapping[str, str] | None,
    ) -> Commit:
        repo = repo_dir.name
        with self._branch_lock(repo_dir, branch):
            head = self._branch_head(repo_dir, branch)
            tree = {e.path: {"sha256": e.sha256, "size": e.size} for e in self._tree(repo_dir, head)} if head else {}
            new_tree = {} if replace else dict(tree)
            for path, entry in changes.items():
                if entry is None:
                    new_tree.pop(path, None)
                else:
                    new_tree[path] = dict(entry)
            if head and new_tree == tree:
                return self.get_commit(repo, head)
            if not new_tree:
                raise StoreError(f"nothing to commit on {repo}/{branch}: the tree would be empty")
            body = {
                "tree": new_tree,
                "parents": [head] if head else [],
                "message": message,
                "metadata": {str(k): str(v) for k, v in (metadata or {}).items()},
            }
            commit_id = hashlib.sha256(_canonical(body)).hexdigest()
            commit_file = repo_dir / "commits" / commit_id[:2] / f"{commit_id}.json"
            if not commit_file.exists():
                atomic_write(commit_file, _canonical(dict(body, created_at=time.time())))
            # The ref update is the commit point.
            self._swap_ref(repo_dir / "refs" / "branches" / branch, head, commit_id)
        return self.get_commit(repo, commit_id)

    def _swap_ref(self, ref: Path, expected: str | None, new: str) -> None:
        """Move ``ref`` from ``expected`` to ``new``, or raise Conflict if it no longer holds ``expected``.
        The caller holds the branch lock; this catches a writer that did not take it."""
        current = ref.read_text().strip() or None
        if current != expected:
            raise Conflict(
                f"branch {ref.name!r} of {ref.parents[2].name!r} moved to {str(current)[:12]} while "
                f"a commit was built on {str(expected)[:12]}; run it again"
            )
        atomic_write(ref, new.encode())

    def tag(self, repo: str, tag: str, ref: str) -> str:
        repo_dir = self._repo(repo)
        commit = self.resolve(repo, ref)
        path = repo_dir / "refs" / "tags" / _check_name("tag", tag)
        # Check and write under one lock, so of two taggers with different commits exactly one succeeds.
        with file_lock(repo_dir / "locks" / f"tag.{tag}.lock"):
            if path.exists():
                existing = path.read_text().strip()
                if existing != commit:
                    raise StoreError(f"tag {tag!r} already points at {existing[:12]} in {repo!r}")
                return commit
            atomic_write(path, commit.encode())
        return commit

    # -- reading ------------------------------------------------------------------------------------
    def resolve(self, repo: str, ref: str) -> str:
        """Branch, tag or commit id (full or a unique prefix of >= 8) -> immutable commit id."""
        repo_dir = self._repo(repo)
        for kind in ("branches", "tags"):
            f = repo_dir / "refs" / kind / ref
            if NAME_RE.match(ref) and f.exists():
                commit = f.read_text().strip()
                if not commit:
                    raise NotFound(f"branch {ref!r} of {repo!r} has no commits yet")
                return commit
        if re.fullmatch(r"[0-9a-f]{8,64}", ref):
            matches = list((repo_dir / "commits" / ref[:2]).glob(f"{ref}*.json"))
            if len(matches) == 1:
                return matches[0].stem
            if len(matches) > 1:
                raise StoreError(f"commit prefix {ref!r} is ambiguous in {repo!r}")
        raise NotFound(f"ref {ref!r} is no branch, tag or commit of {repo!r}")

    def get_commit(self, repo: str, ref: str) -> Commit:
        repo_dir = self._repo(repo)
        cid = self.resolve(repo, ref)
        raw = json.loads((repo_dir / "commits" / cid[:2] / f"{cid}.json").read_bytes())
        body = {k: raw[k] for k in ("tree", "parents", "message", "metadata")}
        if hashlib.sha256(_canonical(body)).hexdigest() != cid:
            raise Corrupt(f"commit {cid} of {repo!r} does not match its id")
        return Commit(cid, tuple(raw["parents"]), raw["message"], raw["metadata"], raw["created_at"])

    def _tree(self, repo_dir: Path, commit_id: str) -> list[Entry]:
        raw = json.loads((repo_dir / "commits" / commit_id[:2] / f"{commit_id}.json").read_bytes())
        return [Entry(p, e["sha256"], e["size"]) for p, e in sorted(raw["tree"].items())]

    def list(self, repo: str, ref: str, prefix: str = "") -> list[Entry]:
        repo_dir = self._repo(repo)
        return [e for e in self._tree(repo_dir, self.resolve(repo, ref)) if e.path.startswith(prefix)]

    def _read_blob(self, repo_dir: Path, entry: Entry) -> bytes:
        blob = self._blob_path(repo_dir, entry.sha256)
        if not blob.exists():
            raise Corrupt(f"{repo_dir.name}:{entry.path}: blob {entry.sha256[:12]} is missing")
        data = blob.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise Corrupt(f"{repo_dir.name}:{entry.path}: checksum mismatch (blob {entry.sha256[:12]})")
        return data

    def read(self, repo: str, ref: str, path: str) -> bytes:
        path = check_path(path)
        repo_dir = self._repo(repo)
        for entry in self._tree(repo_dir, self.resolve(repo, ref)):
            if entry.path == path:
                return self._read_blob(repo_dir, entry)
        raise NotFound(f"{path!r} is not in {repo}@{ref}")

    # builtins.list: in the class body `list` is the method above
    def diff(self, repo: str, left: str, right: str) -> dict[str, builtins.list[str]]:
        """Paths added, removed and changed going from ``left`` to ``right``."""
        a = {e.path: e.sha256 for e in self.list(repo, left)}
        b = {e.path: e.sha256 for e in self.list(repo, right)}
        return {
            "added": sorted(b.keys() - a.keys()),
            "removed": sorted(a.keys() - b.keys()),
            "changed": sorted(p for p in a.keys() & b.keys() if a[p] != b[p]),
        }

    def export(self, repo: str, ref: str, dest: str | os.PathLike) -> Path:
        """Materialise a commit into ``dest`` (verified), via a temp dir renamed into place. Concurrent
        exports to one ``dest`` all succeed: the first rename wins, the others keep its copy."""
        repo_dir = self._repo(repo)
        dest = Path(dest)
        if dest.exists():
            return dest
        entries = self._tree(repo_dir, self.resolve(repo, ref))
        dest.parent.mkdir(parents=True, exist_ok=True)  # the temp dir beside dest: a rename never copies
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".export-"))
        try:
            for entry in entries:
                out = tmp / entry.path
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(self._read_blob(repo_dir, entry))
            return publish_dir(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
