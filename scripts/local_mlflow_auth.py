"""The local profile's MLflow auth app (``make up``): its config, CSRF key and service account, made once
under $TRAINYARD_HOME/mlflow (mode 0600) and printed as shell assignments for scripts/up.sh to ``eval``.

The tasks of the local profile write MLflow's SQLite store directly; the server reads it for the UI and
answers each user with what their teams were granted (trainyard.tracking.mlflow_auth), which the service
account's sync (``python -m trainyard_airflow.mlflow_users``) keeps up to date.
"""

import json
import os
import secrets
import shlex
from pathlib import Path

from trainyard.files import atomic_write
from trainyard.tracking import mlflow_auth

SERVICE_USER = "trainyard"


def main() -> int:
    folder = Path(os.environ["TRAINYARD_HOME"]) / "mlflow"
    kept = folder / "auth_secrets.json"
    known = json.loads(kept.read_text()) if kept.exists() else {}
    for name in ("service_password", "csrf_key"):
        known.setdefault(name, secrets.token_urlsafe(24))
    atomic_write(kept, json.dumps(known).encode())  # mode 0600
    config = mlflow_auth.write_config(
        folder / "auth.ini", f"sqlite:///{folder / 'auth.db'}", SERVICE_USER, known["service_password"]
    )
    env = {
        **mlflow_auth.server_env(config, known["csrf_key"]),
        "SERVICE_USER": SERVICE_USER,
        "SERVICE_PASSWORD": known["service_password"],
    }
    print("\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
