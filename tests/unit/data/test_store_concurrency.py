"""The embedded store and the rename-filled caches under real concurrent processes.

Each test forks its workers (fork: the parent's imports are shared, so the workers are ready at once) and
holds them at a barrier, so they hit the store together rather than one after the other.
"""

import hashlib
import io
import json
import multiprocessing

import numpy as np
import pytest

from trainyard.data.prepare import check_leakage, prepare_records
from trainyard.data.store import Conflict, LocalStore
from trainyard.data.upload import upload_folder, validate_folder

WRITERS = 6
ctx = multiprocessing.get_context("fork")


def _run_together(target, args_of, n=WRITERS, timeout=600):
    """Start ``n`` processes of ``target(i, barrier, results, *args_of(i))``; return {i: result}. A worker
    puts ("ok", value) or ("error", repr)."""
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, barrier, results, *args_of(i))) for i in range(n)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0
    return out


def _guard(i, results, fn):
    try:
        results.put((i, ("ok", fn())))
    except BaseException as err:  # reported to the parent, which fails the test with it
        results.put((i, ("error", repr(err))))


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def classification_folder(root, writer: int) -> dict[str, bytes]:
    """A small valid image-classification folder whose files (names and bytes) are this writer's own,
    except classes.json and labels.csv, which every writer has at the same path."""
    files = {"classes.json": json.dumps({"classes": ["a", "b"], "height": 4, "width": 4, "pixel_max": 255}).encode()}
    rows = ["key,label"]
    for j in range(10):
        key = f"w{writer}-{j}"
        files[f"images/{key}.npy"] = _npy(np.full((4, 4), writer * 10 + j, dtype=np.uint8))
        rows.append(f"{key},{j % 2}")
    files["labels.csv"] = ("\n".join(rows) + "\n").encode()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _history(store, repo, branch):
    commits, c = [], store.get_commit(repo, branch)
    while True:
        commits.append(c.id)
        if not c.parents:
            return commits
        c = store.get_commit(repo, c.parents[0])


def _upload_worker(i, barrier, results, root, folder):
    store = LocalStore(root)
    barrier.wait(timeout=300)
    _guard(i, results, lambda: upload_folder(store, "shared", "main", folder)["commit"])


def test_concurrent_uploads_to_one_branch_each_commit_exactly_their_folder(tmp_path):
    """The reported case: six uploads of six folders to one branch, started together (the CLI's
    ``data upload`` is this call and a print)."""
    folders = {i: classification_folder(tmp_path / f"folder{i}", i) for i in range(WRITERS)}
    root = tmp_path / "store"
    # Validate once here, so great-expectations is imported before the fork and the workers race on the
    # store rather than queue on a minute of imports each.
    assert validate_folder(tmp_path / "folder0", "image_classification").success
    # The repository does not exist yet: the writers also race to create it.
    out = _run_together(_upload_worker, lambda i: (root, tmp_path / f"folder{i}"))
    assert {i: status for i, (status, _) in out.items()} == dict.fromkeys(range(WRITERS), "ok"), out
    store = LocalStore(root)
    reported = {i: cid for i, (_, cid) in out.items()}
    assert len(set(reported.values())) == WRITERS
    history = _history(store, "shared", "main")
    assert sorted(history) == sorted(reported.values())  # every commit that reported success, nothing else
    for i, cid in reported.items():
        tree = {e.path: e.sha256 for e in store.list("shared", cid)}
        assert tree == {p: hashlib.sha256(d).hexdigest() for p, d in folders[i].items()}, f"writer {i}"
        assert store.get_commit("shared", cid).message == f"upload folder{i}"


def test_staging_is_private_to_each_writer(tmp_path):
    a, b = LocalStore(tmp_path), LocalStore(tmp_path)
    a.create_repo("r")
    a.upload("r", "main", "a.txt", b"from a")
    b.upload("r", "main", "b.txt", b"from b")
    first = a.commit("r", "main", "a's upload")
    assert [e.path for e in a.list("r", first.id)] == ["a.txt"]
    second = b.commit("r", "main", "b's upload")
    assert second.parents == (first.id,)
    assert [e.path for e in b.list("r", second.id)] == ["a.txt", "b.txt"]


def test_a_head_moved_under_a_commit_is_a_conflict(tmp_path, monkeypatch):
    """The ref swap checks the head it built on; a writer that ignored the lock is caught, not overwritten."""
    store = LocalStore(tmp_path)
    store.create_repo("r")
    first = store.commit_files("r", "main", {"a": b"1"}, "one")
    ref = tmp_path / "r" / "refs" / "branches" / "main"
    real_tree = LocalStore._tree

    def tree_then_intruder(self, repo_dir, commit_id):
        result = real_tree(self, repo_dir, commit_id)
        ref.write_text("f" * 64)  # another writer, without the lock, moves the branch right now
        return result

    monkeypatch.setattr(LocalStore, "_tree", tree_then_intruder)
    with pytest.raises(Conflict, match="moved"):
        store.commit_files("r", "main", {"b": b"2"}, "two")
    assert ref.read_text() == "f" * 64 and first.id != "f" * 64


def _tag_worker(i, barrier, results, root, commit):
    store = LocalStore(root)
    barrier.wait(timeout=300)
    _guard(i, results, lambda: store.tag("r", "release", commit))


def test_concurrent_tags_one_wins(tmp_path):
    store = LocalStore(tmp_path)
    store.create_repo("r")
    commits = [store.commit_files("r", "main", {"a": str(i).encode()}, f"c{i}").id for i in range(WRITERS)]
    out = _run_together(_tag_worker, lambda i: (tmp_path, commits[i]))
    winners = [i for i, (status, _) in out.items() if status == "ok"]
    assert len(winners) == 1, out
    assert store.resolve("r", "release") == commits[winners[0]]
    assert all("already points" in detail for status, detail in out.values() if status == "error")


def _export_worker(i, barrier, results, root, commit, dest):
    store = LocalStore(root)
    barrier.wait(timeout=300)
    _guard(i, results, lambda: str(store.export("r", commit, dest)))


def test_concurrent_exports_of_one_commit_all_succeed(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.create_repo("r")
    # enough files that every exporter is still writing its copy when the first one renames
    files = {f"d{j % 7}/f{j}.bin": bytes([j % 251]) * 64 for j in range(300)}
    commit = store.commit_files("r", "main", files, "many files").id
    dest = tmp_path / "cache" / "checkouts" / "r" / commit
    out = _run_together(_export_worker, lambda i: (tmp_path / "store", commit, dest))
    assert out == dict.fromkeys(range(WRITERS), ("ok", str(dest))), out
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == files
    assert [p.name for p in dest.parent.iterdir()] == [commit]  # no temp copies left behind


def _samples():
    keys = [f"k{j}" for j in range(40)]
    meta = {"classes": ["x", "y", "z"]}
    return keys, lambda k: (k, int(k[1:]) % 3, np.full((2, 2), int(k[1:]), dtype=np.uint8)), meta


def _prepare_worker(i, barrier, results, cache):
    barrier.wait(timeout=300)
    _guard(i, results, lambda: prepare_records(_samples, "c" * 64, cache, 0.25, 0, fmt="lmdb"))


def test_concurrent_prepares_of_one_split_all_succeed(tmp_path):
    check_leakage({"train": ["a"], "val": ["b"]})  # great-expectations imported before the fork, as above
    out = _run_together(_prepare_worker, lambda i: (tmp_path / "prepared",), n=4)
    assert all(status == "ok" for status, _ in out.values()), out
    manifests = [m.model_dump(exclude={"cached"}) for _, m in out.values()]
    assert all(m == manifests[0] for m in manifests)
    assert [p.name for p in (tmp_path / "prepared").iterdir()] == [manifests[0]["path"].rsplit("/", 1)[1]]
