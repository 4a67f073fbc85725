"""Render airflow.cfg.template into $AIRFLOW_HOME/airflow.cfg.

Secrets (JWT, Fernet) are generated once and kept in $AIRFLOW_HOME/secrets.json, so re-rendering never
invalidates tokens or encrypted connections.
"""

import base64
import json
import os
import secrets
import sys
from pathlib import Path


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    home = Path(os.environ["AIRFLOW_HOME"]).resolve()
    home.mkdir(parents=True, exist_ok=True)
    secrets_file = home / "secrets.json"
    if secrets_file.exists():
        keys = json.loads(secrets_file.read_text())
    else:
        keys = {
            "JWT_SECRET": secrets.token_urlsafe(48),
            "FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        secrets_file.write_text(json.dumps(keys))
        secrets_file.chmod(0o600)
    values = {
        "REPO": str(repo),
        "AIRFLOW_HOME": str(home),
        "API_PORT": os.environ.get("TRAINYARD_API_PORT", "8080"),
        **keys,
    }
    text = (repo / "airflow.cfg.template").read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    if "{{" in text:
        print("unrendered placeholder left in airflow.cfg.template", file=sys.stderr)
        return 1
    (home / "airflow.cfg").write_text(text)
    print(f"rendered {home / 'airflow.cfg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
