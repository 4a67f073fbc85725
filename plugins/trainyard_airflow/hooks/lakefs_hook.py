"""An Airflow hook that turns a ``lakefs`` connection into trainyard's LakeFSStore.

Connection fields: host = the lakeFS endpoint (``http://lakefs:8000``; a bare host name takes its scheme
from ``schema``, default http, and ``port``), login = access key id, password = secret access key,
extra = ``{"storage_namespace": "s3://bucket/prefix"}`` (root for new repositories; optional keys
``pre_sign`` and ``verify_etag`` pass through to LakeFSStore).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.hook import BaseHook

if TYPE_CHECKING:
    from trainyard.data.lakefs_store import LakeFSStore


class LakeFSHook(BaseHook):
    conn_name_attr = "lakefs_conn_id"
    default_conn_name = "lakefs_default"
    conn_type = "lakefs"
    hook_name = "lakeFS"

    def __init__(self, lakefs_conn_id: str = default_conn_name, **kwargs) -> None:
        # Only remember the id: the connection is read (and the store built) when a task asks for it.
        super().__init__(**kwargs)
        self.lakefs_conn_id = lakefs_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"host": "lakeFS endpoint", "login": "Access key ID", "password": "Secret access key"},
            "placeholders": {"host": "http://lakefs:8000", "extra": '{"storage_namespace": "s3://bucket/prefix"}'},
        }

    @staticmethod
    def _endpoint(conn) -> str:
        host = (conn.host or "").strip()
        if "://" in host:
            return host
        return f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")

    def get_store(self) -> LakeFSStore:
        from trainyard.data.lakefs_store import LakeFSStore
        from trainyard.data.store import StoreError

        conn = self.get_connection(self.lakefs_conn_id)
        login, password = conn.login or "", conn.password or ""
        missing = [
            label for label, value in (("host", conn.host), ("login", login), ("password", password)) if not value
        ]
        if missing:
            raise StoreError(
                f"connection {self.lakefs_conn_id!r} lacks {', '.join(missing)} "
                "(host = lakeFS endpoint, login = access key id, password = secret access key)"
            )
        extra = conn.extra_dejson or {}
        options = {k: extra[k] for k in ("pre_sign", "verify_etag") if k in extra}
        return LakeFSStore(
            self._endpoint(conn),
            login,
            password,
            storage_namespace_root=extra.get("storage_namespace") or None,
            **options,
        )


def register_store() -> None:
    """Let trainyard's ``open_store("lakefs")`` use the lakefs_default connection when LAKEFS_* are unset."""
    from trainyard.data.stores import register

    register("lakefs", lambda: LakeFSHook().get_store())
