"""LakeFSStore without a server: configuration, the Airflow hook, error mapping, URIs, read verification.

The store's behaviour against real lakeFS is covered by test_store_contract.py (``lakefs`` backend). Here a
mocked low-level client only raises errors, to check how they are mapped; it never stands in for a backend.
"""

import hashlib
import json
from unittest import mock

import lakefs_sdk
import pytest
import urllib3

from trainyard.data.lakefs_store import SHA_KEY, LakeFSStore, verify_object
from trainyard.data.store import Corrupt, NotFound, StoreError

ENV = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY", "LAKEFS_STORAGE_NAMESPACE")


@pytest.fixture
def no_lakefs_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


# -- configuration ----------------------------------------------------------------------------------
def test_from_env_names_every_missing_variable(no_lakefs_env):
    with pytest.raises(StoreError) as err:
        LakeFSStore.from_env()
    for name in ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"):
        assert name in str(err.value)


def test_from_env_names_only_what_is_missing(no_lakefs_env, monkeypatch):
    monkeypatch.setenv("LAKEFS_ENDPOINT", "http://lakefs:8000")
    monkeypatch.setenv("LAKEFS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    with pytest.raises(StoreError, match="LAKEFS_SECRET_ACCESS_KEY") as err:
        LakeFSStore.from_env()
    assert "LAKEFS_ENDPOINT" not in str(err.value).split(" set")[0]


def test_from_env_builds_a_store_without_calling_the_server(no_lakefs_env, monkeypatch):
    monkeypatch.setenv("LAKEFS_ENDPOINT", "http://lakefs:8000")
    monkeypatch.setenv("LAKEFS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("LAKEFS_SECRET_ACCESS_KEY", "very-secret-key")
    monkeypatch.setenv("LAKEFS_STORAGE_NAMESPACE", "s3://bucket/datasets")
    store = LakeFSStore.from_env()
    assert (store.kind, store.endpoint, store.access_key_id) == ("lakefs", "http://lakefs:8000", "AKIAEXAMPLE")
    assert store.storage_namespace_root == "s3://bucket/datasets"
    assert store._namespace("digits") == "s3://bucket/datasets/digits"
    assert "very-secret-key" not in repr(store)


def test_storage_namespace_root_joins_with_one_slash():
    assert LakeFSStore("http://x", "k", "s", "local://")._namespace("digits") == "local://digits"
    assert LakeFSStore("http://x", "k", "s", "s3://b/p/")._namespace("digits") == "s3://b/p/digits"


def test_sdk_client_gets_the_explicit_credentials():
    client = LakeFSStore("http://lakefs:8000", "AKIAEXAMPLE", "very-secret-key").client
    assert client.config.host == "http://lakefs:8000/api/v1"
    assert (client.config.username, client.config.password) == ("AKIAEXAMPLE", "very-secret-key")


# -- the Airflow hook -------------------------------------------------------------------------------
def _connection(**overrides):
    from airflow.models.connection import Connection

    fields = dict(
        conn_id="lakefs_default",
        conn_type="lakefs",
        host="http://lakefs:8000",
        login="AKIAEXAMPLE",
        password="very-secret-key",
        extra=json.dumps({"storage_namespace": "s3://bucket/datasets"}),
    )
    fields.update(overrides)
    return Connection(**fields)


def test_hook_builds_a_store_from_the_connection(monkeypatch):
    from trainyard_airflow.hooks.lakefs_hook import LakeFSHook

    seen = []

    def get_connection(cls, conn_id):
        seen.append(conn_id)
        return _connection()

    monkeypatch.setattr(LakeFSHook, "get_connection", classmethod(get_connection))
    hook = LakeFSHook()
    assert seen == []  # nothing read at construction
    store = hook.get_store()
    assert seen == ["lakefs_default"]
    assert isinstance(store, LakeFSStore)
    assert store.endpoint == "http://lakefs:8000"
    assert (store.access_key_id, store._secret) == ("AKIAEXAMPLE", "very-secret-key")
    assert store.storage_namespace_root == "s3://bucket/datasets"
    assert (LakeFSHook.conn_type, LakeFSHook.default_conn_name, LakeFSHook.conn_name_attr) == (
        "lakefs",
        "lakefs_default",
        "lakefs_conn_id",
    )


def test_hook_bare_host_takes_scheme_and_port(monkeypatch):
    from trainyard_airflow.hooks.lakefs_hook import LakeFSHook

    conn = _connection(host="lakefs.internal", port=8000, schema="https", extra=None)
    monkeypatch.setattr(LakeFSHook, "get_connection", classmethod(lambda cls, cid: conn))
    store = LakeFSHook("my_lakefs").get_store()
    assert store.endpoint == "https://lakefs.internal:8000"
    assert store.storage_namespace_root is None


def test_hook_names_missing_connection_fields(monkeypatch):
    from trainyard_airflow.hooks.lakefs_hook import LakeFSHook

    conn = _connection(login=None, password=None)
    monkeypatch.setattr(LakeFSHook, "get_connection", classmethod(lambda cls, cid: conn))
    with pytest.raises(StoreError, match="login, password"):
        LakeFSHook().get_store()


# -- error mapping (a mocked low-level client that only fails) --------------------------------------
def _api_error(status, message):
    e = lakefs_sdk.ApiException(status=status, reason=message)
    e.body = json.dumps({"message": message})
    return e


@pytest.fixture
def failing():
    store = LakeFSStore("http://lakefs:8000", "AKIAEXAMPLE", "very-secret-key", "local://")
    store._client = mock.MagicMock()
    return store, store._client.sdk_client


def test_404_becomes_not_found(failing):
    store, sdk = failing
    sdk.commits_api.get_commit.side_effect = _api_error(404, "not found")
    with pytest.raises(NotFound, match="'nope' of 'digits'.*HTTP 404: not found"):
        store.resolve("digits", "nope")


def test_404_on_a_branch_write_becomes_not_found(failing):
    store, sdk = failing
    sdk.objects_api.delete_objects.side_effect = _api_error(404, "branch not found")
    with pytest.raises(NotFound, match="digits/nope:a.txt.*branch not found"):
        store.delete("digits", "nope", "a.txt")


def test_409_becomes_store_error_not_not_found(failing):
    store, sdk = failing
    sdk.repositories_api.create_repository.side_effect = _api_error(409, "repository already exists")
    with pytest.raises(StoreError, match="already exists") as err:
        store.create_repo("digits")
    assert not isinstance(err.value, NotFound)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_say_so(failing, status):
    store, sdk = failing
    sdk.repositories_api.create_repository.side_effect = _api_error(status, "insufficient permissions")
    with pytest.raises(StoreError, match="refused by lakeFS.*access key.*insufficient permissions"):
        store.create_repo("digits")


def test_server_error_and_unreachable_server(failing):
    store, sdk = failing
    sdk.branches_api.diff_branch.side_effect = _api_error(500, "internal error")
    with pytest.raises(StoreError, match="commit digits/main.*HTTP 500: internal error") as err:
        store.commit("digits", "main", "msg")
    assert err.value.retryable  # a server error may pass: the task's retries apply
    sdk.commits_api.get_commit.side_effect = urllib3.exceptions.MaxRetryError(None, "/api/v1", "refused")
    with pytest.raises(StoreError, match="cannot reach lakeFS at http://lakefs:8000") as err:
        store.resolve("digits", "main")
    assert err.value.retryable


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (503, True), (400, False), (403, False)])
def test_only_server_errors_and_throttling_are_retryable(failing, status, retryable):
    store, sdk = failing
    sdk.branches_api.diff_branch.side_effect = _api_error(status, "no")
    with pytest.raises(StoreError) as err:
        store.commit("digits", "main", "msg")
    assert err.value.retryable is retryable


def test_names_are_checked_before_any_request(failing):
    store, sdk = failing
    with pytest.raises(StoreError, match="invalid lakeFS repository name"):
        store.resolve("Bad_Name", "main")
    with pytest.raises(StoreError, match="invalid path"):
        store.upload("digits", "main", "../x", b"")
    assert sdk.method_calls == []


# -- uri and read verification ----------------------------------------------------------------------
def test_uri_format():
    store = LakeFSStore("http://lakefs:8000", "k", "s")
    assert store.uri("digits", "main", "images/0.png") == "lakefs://digits/main/images/0.png"
    assert store.uri("digits", "c" * 64) == f"lakefs://digits/{'c' * 64}/"
    with pytest.raises(StoreError):
        store.uri("digits", "main", "../etc/passwd")


DATA = b"payload"
MD5 = hashlib.md5(DATA).hexdigest()
SHA = hashlib.sha256(DATA).hexdigest()


def test_verify_accepts_matching_checksums():
    verify_object("w", DATA, MD5, len(DATA), {SHA_KEY: SHA})
    verify_object("w", DATA, f'"{MD5.upper()}"', None, {"Trainyard-Sha256": SHA})  # quoted / any case
    verify_object("w", DATA, SHA, len(DATA), None)  # a SHA-256 checksum
    verify_object("w", DATA, f"{MD5[:-1]}0-3", len(DATA), None)  # multipart ETag: not a content hash, skipped


@pytest.mark.parametrize(
    "checksum, size, metadata, match",
    [
        (MD5, len(DATA) + 1, None, "size mismatch"),
        (MD5, len(DATA), {SHA_KEY: "0" * 64}, "SHA-256 mismatch"),
        (hashlib.md5(b"other").hexdigest(), len(DATA), None, "checksum mismatch"),
        (hashlib.sha256(b"other").hexdigest(), len(DATA), None, "checksum mismatch"),
    ],
)
def test_verify_rejects_mismatches(checksum, size, metadata, match):
    with pytest.raises(Corrupt, match=match):
        verify_object("repo@c:path", DATA, checksum, size, metadata)


def test_verify_can_skip_a_non_md5_etag():
    verify_object("w", DATA, hashlib.md5(b"sse-kms").hexdigest(), len(DATA), {SHA_KEY: SHA}, check_etag=False)


# -- repository metadata, as lakeFS's API is asked for it (a local HTTP server records the requests) -------
@pytest.fixture
def recording_server():
    """A local HTTP server that answers as lakeFS does and records (method, path, JSON body) of each request."""
    import http.server
    import threading

    seen = []
    repository = {"id": "pets", "creation_date": 0, "default_branch": "main", "storage_namespace": "local://pets"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status, body=None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 (the handler's protocol)
            length = int(self.headers.get("Content-Length") or 0)
            seen.append(("POST", self.path.split("?")[0], json.loads(self.rfile.read(length) or b"null")))
            if seen[-1][1] == "/api/v1/repositories":
                self._answer(201, repository)
            else:
                self._answer(204)

        def do_GET(self):  # noqa: N802
            seen.append(("GET", self.path.split("?")[0], None))
            self._answer(200, {"trainyard.team": "vision"})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_repository_metadata_goes_to_lakefs_repository_metadata_api(recording_server):
    url, seen = recording_server
    store = LakeFSStore(url, "AKIAEXAMPLE", "very-secret-key", "local://")
    store.create_repo("pets", metadata={"trainyard.team": "vision"})
    assert [(m, p) for m, p, _ in seen] == [
        ("POST", "/api/v1/repositories"),
        ("POST", "/api/v1/repositories/pets/metadata"),
    ]
    assert seen[0][2]["name"] == "pets" and seen[0][2]["storage_namespace"] == "local://pets"
    assert seen[1][2] == {"metadata": {"trainyard.team": "vision"}}
    assert store.repo_metadata("pets") == {"trainyard.team": "vision"}
    assert seen[-1][:2] == ("GET", "/api/v1/repositories/pets/metadata")
