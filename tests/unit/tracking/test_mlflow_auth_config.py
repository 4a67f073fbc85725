"""The auth app's configuration as MLflow itself reads it: the service account is the admin, nobody reads
what they were not given, and a verified login is remembered (a password check costs the server 0.3 s)."""

import stat

from trainyard.tracking.mlflow_auth import LOGIN_CACHE_S, write_config


def test_mlflow_reads_the_admin_the_default_permission_and_the_login_cache(tmp_path, monkeypatch):
    from mlflow.server.auth.config import read_auth_config

    config = write_config(tmp_path / "auth.ini", f"sqlite:///{tmp_path / 'auth.db'}", "trainyard", "s3cret-service")
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(config))
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    read = read_auth_config()
    assert (read.admin_username, read.admin_password) == ("trainyard", "s3cret-service")
    assert read.default_permission == "NO_PERMISSIONS" and not read.grant_default_workspace_access
    assert read.auth_cache_ttl_seconds == LOGIN_CACHE_S > 0
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # it holds the admin's password
