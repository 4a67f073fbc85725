"""One contract for every DatasetStore backend: what the pipeline relies on, run against each.

``local`` always runs. ``lakefs`` runs against a real server when LAKEFS_ENDPOINT and keys are set
(a fresh repository per test, deleted afterwards), and is skipped otherwise.
"""

import contextlib
import hashlib
import os
import uuid

import pytest

from trainyard.data.store import LocalStore, NotFound, StoreError

LAKEFS_SKIP = (
    "no lakeFS server: set LAKEFS_ENDPOINT, LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY "
    "(and LAKEFS_STORAGE_NAMESPACE) to run the contract against one"
)

FOLDER = {
    "images/0.png": b"\x89PNG zero",
    "images/1.png": b"\x89PNG one",
    "images/sub/2.png": b"\x89PNG two",
    "labels.csv": b"key,label\n0,0\n1,1\n2,1\n",
}


@pytest.fixture(params=["local", pytest.param("lakefs", marks=pytest.mark.lakefs)])
def backend(request, tmp_path):
    """(store, repo): a store and a repository name no other test uses (not created yet)."""
    # lakeFS repository ids: lowercase letters, digits and '-' only; valid for LocalStore too.
    repo = f"ty-contract-{uuid.uuid4().hex[:12]}"
    if request.param == "local":
        yield LocalStore(tmp_path / "store"), repo
        return
    if not all(os.environ.get(v) for v in ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY")):
        pytest.skip(LAKEFS_SKIP)
    import lakefs

    from trainyard.data.lakefs_store import LakeFSStore

    store = LakeFSStore.from_env()
    try:
        yield store, repo
    finally:
        with contextlib.suppress(Exception):  # never created, or already gone: nothing to clean
            lakefs.Repository(repo, client=store.client).delete()


@pytest.fixture
def repo_with_commit(backend):
    store, repo = backend
    store.create_repo(repo)
    store.upload(repo, "main", "README.md", b"digits\n")
    store.upload_many(repo, "main", FOLDER)
    commit = store.commit(repo, "main", "first upload", {"kind": "image_classification", "digest": "abc"})
    return store, repo, commit


def test_create_repo(backend):
    store, repo = backend
    assert not store.repo_exists(repo)
    store.create_repo(repo)
    assert store.repo_exists(repo)
    with pytest.raises(StoreError):
        store.create_repo(repo)


def test_upload_commit_and_read_back(backend):
    store, repo = backend
    store.create_repo(repo)
    single = store.upload(repo, "main", "README.md", b"digits\n")
    assert (single.path, single.sha256, single.size) == ("README.md", hashlib.sha256(b"digits\n").hexdigest(), 7)
    entries = store.upload_many(repo, "main", FOLDER)
    assert {e.path: e.sha256 for e in entries} == {p: hashlib.sha256(d).hexdigest() for p, d in FOLDER.items()}

    commit = store.commit(repo, "main", "first upload", {"kind": "image_classification", "files": 5})
    assert commit.message == "first upload"
    assert commit.metadata == {"kind": "image_classification", "files": "5"}  # values are stored as strings
    again = store.get_commit(repo, commit.id)
    assert (again.id, again.message, again.metadata) == (commit.id, commit.message, commit.metadata)
    assert store.read(repo, commit.id, "README.md") == b"digits\n"
    for path, data in FOLDER.items():
        assert store.read(repo, commit.id, path) == data


def test_branch_tag_and_commit_resolve_to_one_immutable_id(repo_with_commit):
    store, repo, commit = repo_with_commit
    assert store.tag(repo, "v1", "main") == commit.id
    assert store.resolve(repo, "main") == store.resolve(repo, "v1") == store.resolve(repo, commit.id) == commit.id
    assert store.get_commit(repo, "v1").id == commit.id


def test_old_commits_keep_old_content(repo_with_commit):
    store, repo, first = repo_with_commit
    store.tag(repo, "v1", first.id)
    store.upload(repo, "main", "labels.csv", b"key,label\n0,1\n")
    second = store.commit(repo, "main", "relabel")
    assert second.id != first.id
    assert second.parents == (first.id,)
    assert store.resolve(repo, "main") == second.id
    assert store.read(repo, first.id, "labels.csv") == FOLDER["labels.csv"]
    assert store.read(repo, "v1", "labels.csv") == FOLDER["labels.csv"]
    assert store.read(repo, "main", "labels.csv") == b"key,label\n0,1\n"


def test_tag_is_idempotent_and_never_moves(repo_with_commit):
    store, repo, first = repo_with_commit
    assert store.tag(repo, "release", first.id) == first.id
    assert store.tag(repo, "release", "main") == first.id  # same commit again: fine
    store.upload(repo, "main", "new.txt", b"new")
    second = store.commit(repo, "main", "more")
    with pytest.raises(StoreError, match="already points"):
        store.tag(repo, "release", second.id)
    assert store.resolve(repo, "release") == first.id
    with pytest.raises(NotFound):
        store.tag(repo, "other", "no-such-branch")


def test_list_with_prefix(repo_with_commit):
    store, repo, commit = repo_with_commit
    everything = store.list(repo, commit.id)
    assert [e.path for e in everything] == sorted(["README.md", *FOLDER])
    images = store.list(repo, commit.id, prefix="images/")
    assert [e.path for e in images] == ["images/0.png", "images/1.png", "images/sub/2.png"]
    for e in images:
        assert (e.sha256, e.size) == (hashlib.sha256(FOLDER[e.path]).hexdigest(), len(FOLDER[e.path]))
    assert store.list(repo, "main", prefix="nothing-here/") == []


def test_diff_two_refs(repo_with_commit):
    store, repo, first = repo_with_commit
    store.delete(repo, "main", "images/1.png")
    store.upload(repo, "main", "labels.csv", b"key,label\n0,0\n2,1\n")
    store.upload(repo, "main", "images/3.png", b"\x89PNG three")
    second = store.commit(repo, "main", "edit")
    assert store.diff(repo, first.id, second.id) == {
        "added": ["images/3.png"],
        "removed": ["images/1.png"],
        "changed": ["labels.csv"],
    }
    # Backwards too: a plain two-tree comparison, not "what changed since the common ancestor".
    assert store.diff(repo, "main", first.id) == {
        "added": ["images/1.png"],
        "removed": ["images/3.png"],
        "changed": ["labels.csv"],
    }
    assert store.diff(repo, first.id, first.id) == {"added": [], "removed": [], "changed": []}


def test_empty_commit_returns_head(repo_with_commit):
    store, repo, first = repo_with_commit
    assert store.commit(repo, "main", "nothing staged").id == first.id
    # Re-uploading identical bytes is no change either: the same data pins the same commit.
    store.upload_many(repo, "main", FOLDER)
    assert store.commit(repo, "main", "same bytes again").id == first.id
    assert store.resolve(repo, "main") == first.id


def test_unknown_refs_and_paths_are_not_found(repo_with_commit):
    store, repo, commit = repo_with_commit
    for ref in ("no-such-branch", "f" * 64):
        with pytest.raises(NotFound):
            store.resolve(repo, ref)
        with pytest.raises(NotFound):
            store.read(repo, ref, "README.md")
    with pytest.raises(NotFound):
        store.get_commit(repo, "no-such-tag")
    with pytest.raises(NotFound):
        store.read(repo, commit.id, "missing.txt")
    with pytest.raises(NotFound):
        store.resolve("ty-no-such-repo", "main")


@pytest.mark.parametrize("bad", ["../escape.txt", "a/../../b", "/etc/passwd", "a\\b", ""])
def test_path_traversal_refused(repo_with_commit, bad):
    store, repo, commit = repo_with_commit
    with pytest.raises(StoreError, match="invalid path"):
        store.upload(repo, "main", bad, b"x")
    with pytest.raises(StoreError, match="invalid path"):
        store.read(repo, commit.id, bad)


def test_export_to_folder(repo_with_commit, tmp_path):
    store, repo, commit = repo_with_commit
    dest = tmp_path / "checkout" / commit.id
    assert store.export(repo, "main", dest) == dest
    files = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert files == {"README.md": b"digits\n", **FOLDER}
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".export-")]  # no temp dir left
    assert store.export(repo, commit.id, dest) == dest  # already there: kept as is


def _reopen(store):
    """A second handle on the same store, as another process would open it."""
    if store.kind == "local":
        return LocalStore(store.root)
    from trainyard.data.lakefs_store import LakeFSStore

    return LakeFSStore.from_env()


def _concurrent_writer(i, store, repo, barrier, results):
    store = _reopen(store)
    files = {f"writer-{i}/{j}.txt": f"writer {i} file {j}".encode() for j in range(3)}
    barrier.wait(timeout=300)
    try:
        results.put((i, "ok", store.commit_files(repo, "main", files, f"writer {i}", {"writer": i}).id))
    except Exception as err:  # reported to the parent, which fails the test with it
        results.put((i, "error", repr(err)))


def test_concurrent_commits_to_one_branch_each_hold_their_own_files(repo_with_commit):
    """Writers started together on one branch: each commit holds its parent's tree plus exactly its own
    files, and the branch history holds every commit that reported success."""
    import multiprocessing

    store, repo, base = repo_with_commit
    writers = 6
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_writer, args=(i, store, repo, barrier, results)) for i in range(writers)]
    for p in procs:
        p.start()
    out = {i: (status, value) for i, status, value in (results.get(timeout=300) for _ in procs)}
    for p in procs:
        p.join(60)
    assert all(status == "ok" for status, _ in out.values()), out
    reported = {i: cid for i, (_, cid) in out.items()}
    assert len(set(reported.values())) == writers

    history, c = [], store.get_commit(repo, "main")
    while c.id != base.id:
        history.append(c.id)
        c = store.get_commit(repo, c.parents[0])
    assert sorted(history) == sorted(reported.values())
    for i, cid in reported.items():
        commit = store.get_commit(repo, cid)
        assert commit.message == f"writer {i}" and commit.metadata == {"writer": str(i)}
        parent = {e.path: e.sha256 for e in store.list(repo, commit.parents[0])}
        own = {f"writer-{i}/{j}.txt": hashlib.sha256(f"writer {i} file {j}".encode()).hexdigest() for j in range(3)}
        assert {e.path: e.sha256 for e in store.list(repo, cid)} == parent | own, f"writer {i}"


def test_commit_files_replace_makes_the_tree_exactly_the_files(repo_with_commit):
    store, repo, first = repo_with_commit
    second = store.commit_files(repo, "main", {"only.txt": b"only"}, "replace all", replace=True)
    assert second.parents == (first.id,)
    assert [e.path for e in store.list(repo, second.id)] == ["only.txt"]
    # The same files again: nothing to commit, the head is kept.
    assert store.commit_files(repo, "main", {"only.txt": b"only"}, "again", replace=True).id == second.id


def test_repository_metadata_is_written_with_the_repository_and_set_key_by_key(backend):
    store, repo = backend
    store.create_repo(repo, metadata={"trainyard.team": "vision"})
    assert store.repo_metadata(repo) == {"trainyard.team": "vision"}
    store.set_repo_metadata(repo, {"trainyard.source": "sklearn_digits"})
    assert store.repo_metadata(repo) == {"trainyard.team": "vision", "trainyard.source": "sklearn_digits"}
    store.set_repo_metadata(repo, {"trainyard.team": "*"})
    assert store.repo_metadata(repo)["trainyard.team"] == "*"
