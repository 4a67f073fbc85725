"""Each team's own DAGs, in Airflow's multi-team mode (``[core] multi_team``).

Airflow authorizes per DAG (and per team), not per run: while every team triggers one shared
``train_pipeline``, everyone who may see it sees every team's runs, task logs and XComs. In multi-team mode
each team of ``resources.yaml`` owns a DAG bundle (``scripts/render_airflow_cfg.py`` writes the list and
the folders), holding links to the DAG files that make a team's DAGs: ``train_pipeline.py`` makes
``train_pipeline.<team>`` there, ``promote_model.py`` ``promote_model.<team>`` (the aliases of the team's
models), ``ingest_dataset.py`` ``ingest_dataset.<team>`` (uploads to the team's datasets) and
``retrain_jobs.py`` the DAGs of the team's job files. A file learns its
team from the bundle it was read from (:func:`bundle_team`); in the shared bundle (``dags/``) these files
then make nothing, so no DAG holds two teams' runs. Airflow then shows a team's DAGs, runs, logs, XComs and
approvals to its members and admins only (``trainyard_airflow.auth_manager``) and answers others 403.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
# The shared bundle: [core] dags_folder (dags/), its DAGs every team's (promote_model.py and the other team
# DAG files make nothing there in multi-team mode)
SHARED_BUNDLE = {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}}
# The settings under which a team DAG file makes the one DAG of every team (multi-team mode off, the shared
# bundle only): what the tests that run DAGs in-process set (tests/conftest.py) and the parse benchmark
# measures with, and what the Airflows started as processes must not inherit
IN_PROCESS_ENV = {
    "AIRFLOW__CORE__MULTI_TEAM": "False",
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([SHARED_BUNDLE]),
}
# The teams' bundles under AIRFLOW_HOME (scripts/render_airflow_cfg.py writes them)
TEAM_BUNDLES_DIR = "team_dags"


def multi_team() -> bool:
    """Whether Airflow runs in multi-team mode (``[core] multi_team``)."""
    from airflow.configuration import conf

    return conf.getboolean("core", "multi_team", fallback=False)


def bundle_teams(airflow_home: Path) -> list[str]:
    """The teams that own a DAG bundle under ``airflow_home`` (the rendered config's): the triggerers to
    start, one per team."""
    folder = airflow_home / TEAM_BUNDLES_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def makes_dags(team: str | None) -> bool:
    """Whether a team DAG file read in ``team``'s bundle (None: the shared one) makes its DAGs: in a team's
    bundle, or anywhere where Airflow is not in multi-team mode."""
    return team is not None or not multi_team()


def bundle_team(path: str) -> str | None:
    """The team whose DAG bundle holds the file ``path`` (as Airflow read it: a link is not followed), or
    None: a bundle of no team, or not in multi-team mode."""
    from airflow.configuration import conf

    if not multi_team():
        return None
    where = os.path.abspath(path)
    bundles: Any = conf.getjson("dag_processor", "dag_bundle_config_list", fallback=[]) or []
    for bundle in bundles:
        root = (bundle.get("kwargs") or {}).get("path")
        if bundle.get("team_name") and root and where.startswith(os.path.abspath(root) + os.sep):
            return str(bundle["team_name"])
    return None


def jobs_without_a_bundle(jobs: list) -> dict[str, str]:
    """In multi-team mode, the job files (:class:`trainyard.retraining.RetrainingJob`) of ``jobs`` whose team
    owns no DAG bundle (added to resources.yaml since the config was rendered), so no bundle makes their
    DAGs: the error of each, by its name. {} where multi-team mode is off (the shared bundle makes them all)."""
    from airflow.configuration import AIRFLOW_HOME

    if not multi_team():
        return {}
    have = set(bundle_teams(Path(AIRFLOW_HOME)))
    return {
        job.name: (
            f"job file {job.name!r}: team {job.spec.resources.team!r} has no DAG bundle yet, so no DAG is made of the "
            "file: run `make setup` (it renders each team's bundle and runs `airflow teams sync`) and restart "
            "Airflow (`make up`)"
        )
        for job in jobs
        if job.spec.resources.team not in have
    }
