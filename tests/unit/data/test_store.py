import json

import pytest

from trainyard.data.store import Corrupt, LocalStore, NotFound, StoreError, tree_digest


@pytest.fixture
def store(tmp_path):
    s = LocalStore(tmp_path / "store")
    s.create_repo("r")
    return s


def test_commit_id_derives_from_content(tmp_path):
    ids = []
    for i in range(2):
        s = LocalStore(tmp_path / f"s{i}")
        s.create_repo("r")
        s.upload_many("r", "main", {"a.txt": b"hello", "b/c.txt": b"world"})
        ids.append(s.commit("r", "main", "first", {"k": "v"}).id)
    assert ids[0] == ids[1]
    s = LocalStore(tmp_path / "s2")
    s.create_repo("r")
    s.upload_many("r", "main", {"a.txt": b"hello", "b/c.txt": b"WORLD"})
    assert s.commit("r", "main", "first", {"k": "v"}).id != ids[0]


def test_same_content_again_keeps_the_head(store):
    store.upload("r", "main", "a", b"1")
    first = store.commit("r", "main", "one")
    store.upload("r", "main", "a", b"1")
    assert store.commit("r", "main", "again").id == first.id


def test_refs_resolve_and_commits_are_immutable(store):
    store.upload("r", "main", "a", b"1")
    c1 = store.commit("r", "main", "one").id
    store.tag("r", "v1", "main")
    store.upload("r", "main", "a", b"2")
    c2 = store.commit("r", "main", "two").id
    assert store.resolve("r", "main") == c2
    assert store.resolve("r", "v1") == c1
    assert store.resolve("r", c1[:10]) == c1
    assert store.read("r", c1, "a") == b"1"
    assert store.read("r", "main", "a") == b"2"
    assert store.get_commit("r", c2).parents == (c1,)
    assert store.diff("r", c1, c2) == {"added": [], "removed": [], "changed": ["a"]}
    with pytest.raises(StoreError, match="already points"):
        store.tag("r", "v1", c2)


def test_read_verifies_checksums(store):
    store.upload("r", "main", "a", b"payload")
    cid = store.commit("r", "main", "one").id
    entry = store.list("r", cid)[0]
    blob = store.root / "r" / "objects" / entry.sha256[:2] / entry.sha256[2:]
    blob.write_bytes(b"tampered")
    with pytest.raises(Corrupt, match="checksum mismatch"):
        store.read("r", cid, "a")


def test_tampered_commit_record_is_detected(store):
    store.upload("r", "main", "a", b"1")
    cid = store.commit("r", "main", "one").id
    f = store.root / "r" / "commits" / cid[:2] / f"{cid}.json"
    raw = json.loads(f.read_text())
    raw["message"] = "rewritten history"
    f.write_text(json.dumps(raw))
    with pytest.raises(Corrupt, match="does not match its id"):
        store.get_commit("r", cid)


def test_crash_before_ref_update_leaves_previous_commit(store, monkeypatch):
    store.upload("r", "main", "a", b"1")
    c1 = store.commit("r", "main", "one").id
    store.upload("r", "main", "a", b"2")
    import trainyard.data.store as mod

    real = mod.atomic_write

    def crash_on_ref(path, data):
        if "refs" in path.parts:
            raise OSError("simulated crash")
        return real(path, data)

    monkeypatch.setattr(mod, "atomic_write", crash_on_ref)
    with pytest.raises(OSError):
        store.commit("r", "main", "two")
    monkeypatch.setattr(mod, "atomic_write", real)
    assert store.resolve("r", "main") == c1
    assert store.read("r", "main", "a") == b"1"


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", "", "a\\b"])
def test_path_traversal_refused(store, bad):
    with pytest.raises(StoreError, match="invalid path"):
        store.upload("r", "main", bad, b"x")


def test_unknown_refs_and_repos(store):
    with pytest.raises(NotFound, match="has no commits yet"):
        store.resolve("r", "main")
    with pytest.raises(NotFound, match="no branch, tag or commit"):
        store.resolve("r", "nope")
    with pytest.raises(NotFound, match="does not exist"):
        store.resolve("other", "main")


def test_export_and_tree_digest(store, tmp_path):
    store.upload_many("r", "main", {"x/1": b"a", "x/2": b"b"})
    cid = store.commit("r", "main", "one").id
    out = store.export("r", cid, tmp_path / "out")
    assert (out / "x" / "1").read_bytes() == b"a"
    assert tree_digest(store.list("r", cid)) == tree_digest(reversed(store.list("r", cid)))
