"""Versioned dataset stores: the DatasetStore protocol and the embedded local store.

The local store keeps lakeFS's semantics on a plain directory:

- repositories hold content-addressed blobs (``objects/ab/cdef...`` named by their SHA-256);
- uploads land in a branch's staging area; ``commit`` turns staging + the branch head into a new commit;
- a commit id is the SHA-256 of its content (tree, parents, message, metadata), so equal content gives
  equal ids; the wall-clock time is recorded beside it, not hashed;
- branches and tags are refs; every ref or staging update is a write to a temp file then ``os.replace``,
  so a crash leaves the previous state intact;
- every read verifies the blob's checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Protocol

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{64}$")


class StoreError(Exception):
    """Any refused or failed store operation; the message says which repo/ref/path."""


class NotFound(StoreError):
    pass


class Corrupt(StoreError):
    pass


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
    """What every backend (local, lakeFS) offers. Paths are POSIX, relative to the repo root."""

    kind: str

    def create_repo(self, repo: str, default_branch: str = "main") -> None: ...
    def upload(self, repo: str, branch: str, path: str, data: bytes) -> Entry: ...
    def commit(self, repo: str, branch: str, message: str, metadata: Mapping[str, str] | None = None) -> Commit: ...
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


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def ingest_files(store, repo: str, branch: str, files: Mapping[str, bytes], message: str,
                 metadata: Mapping[str, str]) -> Commit:
    """Commit a built-in dataset's files to ``repo``/``branch`` (created if missing). Identical content
    commits nothing new, so the same bytes always pin the same commit id."""
    if not store.repo_exists(repo):
        store.create_repo(repo, default_branch=branch)
    store.upload_many(repo, branch, files)
    return store.commit(repo, branch, message=message, metadata=metadata)


def tree_digest(entries: Iterable[Entry]) -> str:
    """Digest of a tree's content (paths and blob hashes): the data's identity, independent of history."""
    return hashlib.sha256(_canonical(sorted((e.path, e.sha256) for e in entries))).hexdigest()


class LocalStore:
    """The embedded store: a directory per repository under ``root``."""

    kind = "local"

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    # -- layout -------------------------------------------------------------------------------------
    def _repo(self, repo: str) -> Path:
        path = self.root / _check_name("repository", repo)
        if not (path / "repo.json").exists():
            raise NotFound(f"repository {repo!r} does not exist in {self.root}")
        return path

    def _blob_path(self, repo_dir: Path, sha: str) -> Path:
        return repo_dir / "objects" / sha[:2] / sha[2:]

    # -- repositories and branches ----------------------------------------------------------------
    def create_repo(self, repo: str, default_branch: str = "main") -> None:
        path = self.root / _check_name("repository", repo)
        _check_name("branch", default_branch)
        if (path / "repo.json").exists():
            raise StoreError(f"repository {repo!r} already exists")
        _atomic_write(path / "refs" / "branches" / default_branch, b"")
        _atomic_write(path / "repo.json", _canonical({"default_branch": default_branch, "created_at": time.time()}))

    def repo_exists(self, repo: str) -> bool:
        return (self.root / _check_name("repository", repo) / "repo.json").exists()

    def create_branch(self, repo: str, branch: str, source: str) -> str:
        repo_dir = self._repo(repo)
        ref = repo_dir / "refs" / "branches" / _check_name("branch", branch)
        if ref.exists():
            raise StoreError(f"branch {branch!r} already exists in {repo!r}")
        commit = self.resolve(repo, source)
        _atomic_write(ref, commit.encode())
        return commit

    def _branch_head(self, repo_dir: Path, branch: str) -> str | None:
        ref = repo_dir / "refs" / "branches" / _check_name("branch", branch)
        if not ref.exists():
            raise NotFound(f"branch {branch!r} does not exist in {repo_dir.name!r}")
        return ref.read_text().strip() or None

    # -- writing ------------------------------------------------------------------------------------
    def _staging_file(self, repo_dir: Path, branch: str) -> Path:
        return repo_dir / "staging" / f"{branch}.json"

    def _staged(self, repo_dir: Path, branch: str) -> dict[str, dict]:
        f = self._staging_file(repo_dir, branch)
        return json.loads(f.read_bytes()) if f.exists() else {}

    def _put_blob(self, repo_dir: Path, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        blob = self._blob_path(repo_dir, sha)
        if not blob.exists():
            _atomic_write(blob, data)
        return sha

    def upload(self, repo: str, branch: str, path: str, data: bytes) -> Entry:
        return self.upload_many(repo, branch, {path: data})[0]

    def upload_many(self, repo: str, branch: str, files: Mapping[str, bytes]) -> list[Entry]:
        """Stage many files with one staging-index write (blobs first, so the index never dangles)."""
        repo_dir = self._repo(repo)
        self._branch_head(repo_dir, branch)
        staged = self._staged(repo_dir, branch)
        entries = []
        for path, data in files.items():
            path = check_path(path)
            sha = self._put_blob(repo_dir, data)
            staged[path] = {"sha256": sha, "size": len(data)}
            entries.append(Entry(path, sha, len(data)))
        _atomic_write(self._staging_file(repo_dir, branch), _canonical(staged))
        return entries

    def delete(self, repo: str, branch: str, path: str) -> None:
        repo_dir = self._repo(repo)
        staged = self._staged(repo_dir, branch)
        staged[check_path(path)] = None
        _atomic_write(self._staging_file(repo_dir, branch), _canonical(staged))

    def commit(self, repo: str, branch: str, message: str, metadata: Mapping[str, str] | None = None) -> Commit:
        """Commit staged changes. With nothing staged (or staging equal to the head) it returns the head
        unchanged, so re-ingesting identical data pins the same commit."""
        repo_dir = self._repo(repo)
        head = self._branch_head(repo_dir, branch)
        tree = {e.path: {"sha256": e.sha256, "size": e.size} for e in self._tree(repo_dir, head)} if head else {}
        staged = self._staged(repo_dir, branch)
        new_tree = dict(tree)
        for path, entry in staged.items():
            if entry is None:
                new_tree.pop(path, None)
            else:
                new_tree[path] = entry
        if head and new_tree == tree:
            self._staging_file(repo_dir, branch).unlink(missing_ok=True)
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
        record = dict(body, created_at=time.time())
        commit_file = repo_dir / "commits" / commit_id[:2] / f"{commit_id}.json"
        if not commit_file.exists():
            _atomic_write(commit_file, _canonical(record))
        # The ref update is the commit point; staging is cleared after, and is idempotent if it is not.
        _atomic_write(repo_dir / "refs" / "branches" / branch, commit_id.encode())
        self._staging_file(repo_dir, branch).unlink(missing_ok=True)
        return self.get_commit(repo, commit_id)

    def tag(self, repo: str, tag: str, ref: str) -> str:
        repo_dir = self._repo(repo)
        commit = self.resolve(repo, ref)
        path = repo_dir / "refs" / "tags" / _check_name("tag", tag)
        if path.exists() and path.read_text().strip() != commit:
            raise StoreError(f"tag {tag!r} already points at {path.read_text().strip()[:12]} in {repo!r}")
        _atomic_write(path, commit.encode())
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

    def diff(self, repo: str, left: str, right: str) -> dict[str, list[str]]:
        """Paths added, removed and changed going from ``left`` to ``right``."""
        a = {e.path: e.sha256 for e in self.list(repo, left)}
        b = {e.path: e.sha256 for e in self.list(repo, right)}
        return {
            "added": sorted(b.keys() - a.keys()),
            "removed": sorted(a.keys() - b.keys()),
            "changed": sorted(p for p in a.keys() & b.keys() if a[p] != b[p]),
        }

    def export(self, repo: str, ref: str, dest: str | os.PathLike) -> Path:
        """Materialise a commit into ``dest`` (verified), via a temp dir renamed into place."""
        repo_dir = self._repo(repo)
        dest = Path(dest)
        if dest.exists():
            return dest
        tmp = Path(tempfile.mkdtemp(dir=dest.parent if dest.parent.exists() else None, prefix=".export-"))
        try:
            for entry in self._tree(repo_dir, self.resolve(repo, ref)):
                out = tmp / entry.path
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(self._read_blob(repo_dir, entry))
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest
