"""Render airflow.cfg.template into $AIRFLOW_HOME/airflow.cfg, and each team's DAG bundle.

Secrets (the JWT secret, the Fernet key, the API's secret key) are generated once and kept in
$AIRFLOW_HOME/secrets.json, so re-rendering never invalidates tokens or encrypted connections.

Airflow runs in multi-team mode: the shared bundle is the repository's dags/ folder, and each team of
resources.yaml (TRAINYARD_CONFIG_DIR) owns a bundle, $AIRFLOW_HOME/team_dags/<team>, of links to the DAG
files that make a team's own DAGs (plugins/trainyard_airflow/team_dags.py). A team added to resources.yaml
needs a new rendering, `airflow teams sync` and a restart of Airflow (`make up` does all three).
"""

import base64
import json
import os
import secrets
import shutil
import sys
from pathlib import Path

# The DAG files that make a team's own DAGs where they are read in its bundle (team_dags.bundle_team).
TEAM_DAG_FILES = ("train_pipeline.py", "retrain_jobs.py", "promote_model.py", "ingest_dataset.py")


def team_bundles(repo: Path, home: Path) -> list[dict]:
    """The DAG bundles: the shared one (``[core] dags_folder``), one per team of the resources in force,
    whose folder (made here; a removed team's goes) links the team DAG files, and those of
    ``TRAINYARD_EXTRA_DAG_BUNDLES`` (a JSON list, e.g. the scheduler benchmark's)."""
    sys.path.insert(0, str(repo / "plugins"))
    from trainyard.scheduling.resources import load_resources
    from trainyard.teams import airflow_team_problems
    from trainyard_airflow.team_dags import LOCAL_BUNDLE, SHARED_BUNDLE, TEAM_BUNDLES_DIR

    config = load_resources()
    problems = airflow_team_problems(config)
    if problems:
        raise SystemExit("\n".join(problems))
    root = home / TEAM_BUNDLES_DIR
    for gone in (p for p in root.glob("*") if p.name not in config.teams):
        shutil.rmtree(gone)
    bundles = [SHARED_BUNDLE]
    for team in config.teams:
        folder = root / team
        folder.mkdir(parents=True, exist_ok=True)
        for name in TEAM_DAG_FILES:
            link = folder / name
            if not link.is_symlink() or link.resolve() != repo / "dags" / name:
                link.unlink(missing_ok=True)
                link.symlink_to(repo / "dags" / name)
        path = {"path": str(folder)}
        bundles.append({"name": f"team-{team}", "classpath": LOCAL_BUNDLE, "kwargs": path, "team_name": team})
    return bundles + json.loads(os.environ.get("TRAINYARD_EXTRA_DAG_BUNDLES") or "[]")


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    home = Path(os.environ["AIRFLOW_HOME"]).resolve()
    home.mkdir(parents=True, exist_ok=True)
    secrets_file = home / "secrets.json"
    kept = json.loads(secrets_file.read_text()) if secrets_file.exists() else {}
    made = {
        "JWT_SECRET": lambda: secrets.token_urlsafe(48),
        "FERNET_KEY": lambda: base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "API_SECRET_KEY": lambda: secrets.token_urlsafe(32),  # a home rendered before it existed gets one
    }
    keys = {name: kept.get(name) or make() for name, make in made.items()}
    if keys != kept:
        secrets_file.write_text(json.dumps(keys))
        secrets_file.chmod(0o600)
    values = {
        "REPO": str(repo),
        "AIRFLOW_HOME": str(home),
        "API_PORT": os.environ.get("TRAINYARD_API_PORT", "8080"),
        "BUNDLES": json.dumps(team_bundles(repo, home)),
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
