"""The lakeFS backend of the DatasetStore protocol, on the official high-level ``lakefs`` SDK.

It keeps LocalStore's meaning, so code and tests written against one hold for the other:

- ``read``, ``list``, ``diff`` and ``export`` resolve the ref to a commit id first, so they see committed
  data only (a branch's staged uploads stay invisible until ``commit``, as in LocalStore), and a branch
  that moves mid-export cannot mix two commits;
- every upload records the SHA-256 of its bytes as user metadata (``trainyard-sha256``): lakeFS's own
  checksum is the storage ETag (MD5 for simple uploads, something else for multipart or SSE-KMS), while
  ``Entry.sha256`` and ``tree_digest`` need the content's SHA-256 to match what LocalStore and
  ``upload.folder_digest`` compute;
- ``read``/``export`` verify the size, that SHA-256, and the lakeFS checksum when it is a plain hex MD5
  or SHA-256 (see ``verify_object``);
- ``commit`` with nothing to commit returns the branch head unchanged; lakeFS refuses an empty commit;
- lakeFS's staging area is one per branch, shared by every writer, so ``commit_files`` (the call for
  writers that share a branch) stages on a branch of its own and merges it back; lakeFS serialises commits
  and merges on a branch, and a merge that conflicts with a commit that landed meanwhile raises Conflict;
- lakeFS errors become StoreError / NotFound with the repo, ref or path in the message.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.data.store import (
    Commit,
    Conflict,
    Corrupt,
    Entry,
    NotFound,
    StoreError,
    Unavailable,
    _check_name,
    check_path,
    publish_dir,
)

if TYPE_CHECKING:
    import lakefs

SHA_KEY = "trainyard-sha256"
# lakeFS's own rule for repository ids; checked here so a bad name fails before any request.
REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
ENV = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY")
PAGE = 1000  # listing page size (the server's maximum); fewer round trips than its default 100


def _check_repo(repo: str) -> str:
    if not isinstance(repo, str) or not REPO_RE.match(repo):
        raise StoreError(f"invalid lakeFS repository name {repo!r}: 3-63 lowercase letters, digits or '-'")
    return repo


def _user_sha(metadata: Mapping[str, str] | None) -> str | None:
    # Header-borne metadata may come back with any case; the key is ours, so match it case-insensitively.
    for k, v in (metadata or {}).items():
        if k.lower() == SHA_KEY:
            return v.lower()
    return None


def verify_object(
    where: str,
    data: bytes,
    checksum: str | None,
    size: int | None,
    metadata: Mapping[str, str] | None,
    check_etag: bool = True,
) -> None:
    """Raise Corrupt unless ``data`` matches what lakeFS recorded for the object.

    Checked: the size; the ``trainyard-sha256`` metadata written by ``upload``; and lakeFS's checksum when
    it is 32 hex digits (MD5) or 64 (SHA-256). Other checksums (multipart ETags ``<hex>-<parts>``, base64,
    Azure ETags) say nothing about the bytes and are skipped. ``check_etag=False`` skips the lakeFS checksum
    for buckets whose ETag is not the content MD5 even for simple uploads (S3 SSE-KMS, SSE-C)."""
    if size is not None and size != len(data):
        raise Corrupt(f"{where}: size mismatch (lakeFS says {size} bytes, read {len(data)})")
    sha = _user_sha(metadata)
    if sha and hashlib.sha256(data).hexdigest() != sha:
        raise Corrupt(f"{where}: SHA-256 mismatch with the recorded {sha[:12]}")
    etag = (checksum or "").strip().strip('"').lower()
    if check_etag and re.fullmatch(r"[0-9a-f]{32}|[0-9a-f]{64}", etag):
        algo = hashlib.md5 if len(etag) == 32 else hashlib.sha256
        if algo(data).hexdigest() != etag:
            raise Corrupt(f"{where}: checksum mismatch with lakeFS's {etag[:12]}")


def _entry(info) -> Entry:
    # Objects written by other tools carry no SHA-256; a prefixed lakeFS checksum keeps their tree digest
    # distinct from any content hash instead of silently equal to one.
    return Entry(info.path, _user_sha(info.metadata) or f"lakefs:{info.checksum}", info.size_bytes or 0)


def _detail(e: Exception) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            body = None
    message = body.get("message") if isinstance(body, dict) else None
    status = getattr(e, "status_code", None) or getattr(e, "status", None)
    if status is None:
        return str(e) or type(e).__name__
    return f"HTTP {status}: {message or getattr(e, 'reason', '') or type(e).__name__}"


def _by_status(status: int | None) -> type[StoreError]:
    """A server error or throttling (5xx, 429) may pass: retryable; any other refusal is permanent."""
    return Unavailable if status is not None and (status >= 500 or status == 429) else StoreError


class LakeFSStore:
    """A lakeFS server as a DatasetStore. No request is made until a method needs one."""

    kind = "lakefs"

    def __init__(
        self,
        endpoint: str,
        access_key_id: str,
        secret_access_key: str,
        storage_namespace_root: str | None = None,
        *,
        pre_sign: bool = False,
        verify_etag: bool = True,
        max_workers: int = 8,
    ) -> None:
        self.endpoint = endpoint
        self.access_key_id = access_key_id
        self._secret = secret_access_key
        self.storage_namespace_root = storage_namespace_root
        # pre_sign=False sends bytes through the lakeFS server, so only the server must be reachable (and
        # the SDK makes no extra config/repository calls to decide); True moves them to the object store.
        self.pre_sign = pre_sign
        self.verify_etag = verify_etag
        self.max_workers = max_workers
        self._client: lakefs.Client | None = None

    def __repr__(self) -> str:  # never the secret
        return f"LakeFSStore(endpoint={self.endpoint!r}, access_key_id={self.access_key_id!r})"

    @classmethod
    def from_env(cls, **kwargs) -> LakeFSStore:
        missing = [name for name in ENV if not os.environ.get(name)]
        if missing:
            raise StoreError(
                f"the lakeFS store needs {', '.join(missing)} set (and LAKEFS_STORAGE_NAMESPACE, "
                "e.g. local:// or s3://bucket/prefix, to create repositories)"
            )
        endpoint, access_key_id, secret_access_key = (os.environ[name] for name in ENV)
        return cls(
            endpoint,
            access_key_id,
            secret_access_key,
            storage_namespace_root=os.environ.get("LAKEFS_STORAGE_NAMESPACE") or None,
            **kwargs,
        )

    @property
    def client(self) -> lakefs.Client:
        if self._client is None:
            import lakefs

            # Explicit credentials: with keyword arguments the SDK reads no ~/.lakectl.yaml or LAKECTL_* vars.
            self._client = lakefs.Client(host=self.endpoint, username=self.access_key_id, password=self._secret)
        return self._client

    def _repo(self, repo: str):
        import lakefs

        return lakefs.Repository(_check_repo(repo), client=self.client)

    @contextmanager
    def _errors(self, what: str):
        """Map the SDK's exceptions to ours, naming ``what`` failed."""
        import lakefs_sdk
        import urllib3
        from lakefs.exceptions import (
            ConflictException,
            ForbiddenException,
            LakeFSException,
            NotAuthorizedException,
            NotFoundException,
        )

        try:
            yield
        except NotFoundException as e:
            raise NotFound(f"{what}: not found ({_detail(e)})") from e
        except ConflictException as e:
            raise StoreError(f"{what}: already exists or conflicts ({_detail(e)})") from e
        except (NotAuthorizedException, ForbiddenException) as e:
            raise StoreError(
                f"{what}: refused by lakeFS at {self.endpoint}; check the access key and its policies ({_detail(e)})"
            ) from e
        except LakeFSException as e:
            raise _by_status(getattr(e, "status_code", None))(f"{what}: lakeFS error ({_detail(e)})") from e
        except lakefs_sdk.ApiException as e:  # the few SDK paths that do not wrap the generated client's errors
            raise (NotFound if e.status == 404 else _by_status(e.status))(f"{what}: lakeFS error ({_detail(e)})") from e
        except urllib3.exceptions.HTTPError as e:
            raise Unavailable(f"{what}: cannot reach lakeFS at {self.endpoint} ({e})") from e

    # -- repositories and branches ----------------------------------------------------------------
    def _namespace(self, repo: str) -> str:
        root = self.storage_namespace_root
        if not root:
            with self._errors("read the server's default storage namespace"):
                root = self.client.storage_config.default_namespace_prefix
        if not root:
            raise StoreError(
                "no storage namespace for new repositories: set LAKEFS_STORAGE_NAMESPACE "
                "(or the connection extra 'storage_namespace'), e.g. local:// or s3://bucket/prefix"
            )
        return (root if root.endswith("/") else root + "/") + repo

    def create_repo(self, repo: str, default_branch: str = "main", metadata: Mapping[str, str] | None = None) -> None:
        """Create ``repo``; its ``metadata`` follows in a second request (lakeFS creates a repository without
        any), so a reader may see the repository for a moment without it."""
        _check_name("branch", default_branch)
        handle = self._repo(repo)
        with self._errors(f"create repository {repo!r}"):
            handle.create(storage_namespace=self._namespace(repo), default_branch=default_branch)
        if metadata:
            self.set_repo_metadata(repo, metadata)

    def repo_metadata(self, repo: str) -> dict[str, str]:
        with self._errors(f"read the metadata of repository {repo!r}"):
            return dict(self._repo(repo).metadata or {})

    def set_repo_metadata(self, repo: str, metadata: Mapping[str, str]) -> None:
        """Set the keys of ``metadata`` on ``repo`` (the others stay)."""
        import lakefs_sdk

        body = lakefs_sdk.RepositoryMetadataSet(metadata={k: str(v) for k, v in metadata.items()})
        with self._errors(f"set the metadata of repository {repo!r}"):
            self.client.sdk_client.internal_api.set_repository_metadata(_check_repo(repo), body)

    def repo_exists(self, repo: str) -> bool:
        handle = self._repo(repo)
        try:
            with self._errors(f"repository {repo!r}"):
                handle.properties  # noqa: B018 (a GET of the repository)
        except NotFound:
            return False
        return True

    def create_branch(self, repo: str, branch: str, source: str) -> str:
        _check_name("branch", branch)
        commit = self.resolve(repo, source)
        with self._errors(f"create branch {branch!r} in {repo!r}"):
            self._repo(repo).branch(branch).create(commit)
        return commit

    # -- writing ------------------------------------------------------------------------------------
    def upload(self, repo: str, branch: str, path: str, data: bytes) -> Entry:
        return self.upload_many(repo, branch, {path: data})[0]

    def upload_many(self, repo: str, branch: str, files: Mapping[str, bytes]) -> list[Entry]:
        """Stage files on ``branch``, a few in parallel. Every path is checked before the first upload."""
        _check_name("branch", branch)
        items = [(check_path(p), bytes(d)) for p, d in files.items()]
        handle = self._repo(repo).branch(branch)

        def put(item: tuple[str, bytes]) -> Entry:
            path, data = item
            sha = hashlib.sha256(data).hexdigest()
            with self._errors(f"upload {repo}/{branch}:{path}"):
                handle.object(path).upload(data, mode="wb", pre_sign=self.pre_sign, metadata={SHA_KEY: sha})
            return Entry(path, sha, len(data))

        if len(items) <= 1:
            return [put(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(items))) as pool:
            return list(pool.map(put, items))

    def delete(self, repo: str, branch: str, path: str) -> None:
        path = check_path(path)
        with self._errors(f"delete {repo}/{branch}:{path}"):
            # The bulk call treats a missing path as deleted, like LocalStore's staged removal.
            result = self._repo(repo).branch(branch).delete_objects([path])
        if getattr(result, "errors", None):
            raise StoreError(f"delete {repo}/{branch}:{path}: {result.errors[0].message}")

    def commit(self, repo: str, branch: str, message: str, metadata: Mapping[str, str] | None = None) -> Commit:
        """Commit staged changes; with none (or only byte-identical re-uploads) return the head unchanged."""
        from lakefs.exceptions import BadRequestException

        handle = self._repo(repo).branch(branch)
        with self._errors(f"commit {repo}/{branch}"):
            if not list(handle.uncommitted(max_amount=1, amount=1)):
                return self.get_commit(repo, branch)
            try:
                ref = handle.commit(message, metadata={str(k): str(v) for k, v in (metadata or {}).items()})
            except BadRequestException as e:
                # lakeFS answers 400 "no changes" when the staged entries equal the head's (same checksums),
                # or when another writer committed them first.
                if "no changes" not in _detail(e).lower():
                    raise
                return self.get_commit(repo, branch)
        return self.get_commit(repo, ref.id)

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
        """Commit ``files`` on top of the branch head (``replace``: as the whole tree) without sharing the
        branch's staging area: a private branch from the head gets the files and a commit, then that change
        lands on ``branch`` as one commit whose parent is the head at that time (a squash merge; with
        ``replace``, a commit of the private commit's tree)."""
        import uuid

        import lakefs_sdk
        from lakefs.exceptions import BadRequestException, ConflictException

        _check_name("branch", branch)
        items = {check_path(p): bytes(d) for p, d in files.items()}
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
        head = self.resolve(repo, branch)
        handle = self._repo(repo)
        work = f"tx-{uuid.uuid4().hex}"
        with self._errors(f"create branch {work!r} in {repo!r}"):
            tx = handle.branch(work).create(head)
        try:
            self.upload_many(repo, work, items)
            stale = sorted({o.path for o in self._objects(repo, head)} - items.keys()) if replace else []
            with self._errors(f"commit {repo}/{work}"):
                if stale:
                    tx.delete_objects(stale)
                if not list(tx.uncommitted(max_amount=1, amount=1)):
                    return self.get_commit(repo, head)
                try:
                    done = tx.commit(message, metadata=meta)
                except BadRequestException as e:  # only byte-identical re-uploads: nothing changed
                    if "no changes" not in _detail(e).lower():
                        raise
                    return self.get_commit(repo, head)
            if replace:
                # The tree is the files whatever landed on the branch meanwhile: commit the work commit's
                # tree (its metarange) onto the branch as is; lakeFS holds the branch lock for it.
                with self._errors(f"commit to {repo}/{branch}"):
                    merged = self.client.sdk_client.commits_api.commit(
                        repo,
                        branch,
                        # lakefs_sdk's models are pydantic.v1, whose Field defaults the pydantic plugin cannot read
                        lakefs_sdk.CommitCreation(message=message, metadata=meta),  # type: ignore[call-arg]
                        source_metarange=done.get_commit().meta_range_id,
                    ).id
            else:
                with self._errors(f"merge {work} into {repo}/{branch}"):
                    try:
                        merged = tx.merge_into(handle.branch(branch), message=message, metadata=meta, squash_merge=True)
                    except ConflictException as e:
                        raise Conflict(
                            f"{repo}/{branch} changed the same paths since {head[:12]}; run it again ({_detail(e)})"
                        ) from e
        finally:
            try:
                with self._errors(f"delete branch {work!r} of {repo!r}"):
                    tx.delete()
            except StoreError:  # the data is committed (or refused); a leftover branch is only clutter
                pass
        return self.get_commit(repo, merged)

    def tag(self, repo: str, tag: str, ref: str) -> str:
        from lakefs.exceptions import ConflictException

        _check_name("tag", tag)
        commit = self.resolve(repo, ref)
        handle = self._repo(repo).tag(tag)
        with self._errors(f"tag {tag!r} in {repo!r}"):
            try:
                handle.create(commit)
            except ConflictException:
                existing = handle.get_commit().id  # re-tagging the same commit is a no-op, as in LocalStore
                if existing != commit:
                    raise StoreError(f"tag {tag!r} already points at {existing[:12]} in {repo!r}") from None
        return commit

    # -- reading ------------------------------------------------------------------------------------
    def get_commit(self, repo: str, ref: str) -> Commit:
        if not ref:
            raise StoreError(f"empty ref for {repo!r}")
        with self._errors(f"ref {ref!r} of {repo!r}"):
            c = self._repo(repo).ref(ref).get_commit()
        return Commit(c.id, tuple(c.parents or ()), c.message, dict(c.metadata or {}), float(c.creation_date))

    def resolve(self, repo: str, ref: str) -> str:
        """Branch, tag or commit id (or a prefix lakeFS accepts) -> immutable commit id."""
        return self.get_commit(repo, ref).id

    def _objects(self, repo: str, commit: str, prefix: str = "") -> list:
        with self._errors(f"list {repo}@{commit[:12]}"):
            found = self._repo(repo).ref(commit).objects(prefix=prefix or None, user_metadata=True, amount=PAGE)
            return sorted(found, key=lambda o: o.path)

    def list(self, repo: str, ref: str, prefix: str = "") -> list[Entry]:
        return [_entry(o) for o in self._objects(repo, self.resolve(repo, ref), prefix)]

    def _fetch(self, repo: str, commit: str, info) -> bytes:
        where = f"{repo}@{commit[:12]}:{info.path}"
        with self._errors(where):
            obj = self._repo(repo).ref(commit).object(info.path)
            with obj.reader(mode="rb", pre_sign=self.pre_sign) as fh:
                data = fh.read()
        verify_object(where, data, info.checksum, info.size_bytes, info.metadata, self.verify_etag)
        return data

    def read(self, repo: str, ref: str, path: str) -> bytes:
        path = check_path(path)
        commit = self.resolve(repo, ref)
        with self._errors(f"{path!r} in {repo}@{ref}"):
            info = self._repo(repo).ref(commit).object(path).stat()
        return self._fetch(repo, commit, info)

    # builtins.list: in the class body `list` is the method above
    def diff(self, repo: str, left: str, right: str) -> dict[str, builtins.list[str]]:
        """Paths added, removed and changed going from ``left`` to ``right``."""
        a, b = self.resolve(repo, left), self.resolve(repo, right)
        out: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
        with self._errors(f"diff {repo} {left}..{right}"):
            # two_dot compares the two trees; the server default (three_dot) diffs from their merge base,
            # which would report nothing when going from a newer commit back to an older one.
            for change in self._repo(repo).ref(a).diff(other_ref=b, type="two_dot", amount=PAGE):
                if change.path_type == "object" and change.type in out:
                    out[change.type].append(change.path)
        return {k: sorted(v) for k, v in out.items()}

    def export(self, repo: str, ref: str, dest: str | os.PathLike) -> Path:
        """Materialise a commit into ``dest`` (verified), via a temp dir renamed into place."""
        dest = Path(dest)
        if dest.exists():
            return dest
        commit = self.resolve(repo, ref)
        infos = self._objects(repo, commit)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".export-"))

        def fetch(info) -> None:
            out = tmp / check_path(info.path)  # keys come from the server: refuse any that climb out of tmp
            data = self._fetch(repo, commit, info)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)

        try:
            with ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(infos)))) as pool:
                list(pool.map(fetch, infos))
            return publish_dir(tmp, dest)  # another exporter finishing first is success
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def uri(self, repo: str, ref: str, path: str = "") -> str:
        """The lakefs:// URI of a path at a ref, as lakectl, Spark and the S3 gateway tools take it."""
        return f"lakefs://{_check_repo(repo)}/{ref}/{check_path(path) if path else ''}"
