"""Each team's own DAGs in Airflow's multi-team mode: the rendered bundles (a folder per team of
resources.yaml, linking the team DAG files), and what Airflow's own DagBag makes of those files in a team's
bundle and in the shared one."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LOCAL = "airflow.dag_processing.bundles.local.LocalDagBundle"


def test_the_rendered_config_gives_each_team_a_bundle_of_links_to_the_team_dag_files(tmp_path):
    """... beside the shared bundle ([core] dags_folder) and the extra ones asked for; a removed team's
    folder goes."""
    (tmp_path / "team_dags" / "gone").mkdir(parents=True)  # a team resources.yaml no longer lists
    extra = [{"name": "more", "classpath": LOCAL, "kwargs": {"path": str(tmp_path)}}]
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "TRAINYARD_EXTRA_DAG_BUNDLES": json.dumps(extra)}
    render = [sys.executable, "scripts/render_airflow_cfg.py"]
    subprocess.run(render, env=env, cwd=REPO, check=True, capture_output=True)
    cfg = (tmp_path / "airflow.cfg").read_text()
    line = next(x for x in cfg.splitlines() if x.startswith("dag_bundle_config_list"))
    bundles = json.loads(line.split("=", 1)[1])
    assert bundles[0] == {"name": "dags-folder", "classpath": LOCAL, "kwargs": {}}
    assert bundles[-1] == extra[0]
    assert {b["team_name"] for b in bundles[1:-1]} == {"default", "vision", "nlp", "research"}  # resources.yaml
    assert sorted(p.name for p in (tmp_path / "team_dags").iterdir()) == ["default", "nlp", "research", "vision"]
    vision = next(b for b in bundles if b.get("team_name") == "vision")
    folder = Path(vision["kwargs"]["path"])
    assert folder == tmp_path / "team_dags" / "vision"
    assert {p.name: p.resolve() for p in folder.iterdir()} == {
        "train_pipeline.py": REPO / "dags" / "train_pipeline.py",
        "retrain_jobs.py": REPO / "dags" / "retrain_jobs.py",
        "promote_model.py": REPO / "dags" / "promote_model.py",
        "ingest_dataset.py": REPO / "dags" / "ingest_dataset.py",
    }
    assert "multi_team = True" in cfg and "TeamsFromResourcesAuthManager" in cfg


TEAM_FILES = ("train_pipeline.py", "promote_model.py", "ingest_dataset.py")
PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
out = {}
for folder in sys.argv[1:]:
    bag = DagBag(dag_folder=folder)
    errors = {k: str(v)[-300:] for k, v in bag.import_errors.items()}
    teams = {d: dag.params["resources.team"] if "resources.team" in dag.params else dag.params.get("team")
             for d, dag in bag.dags.items()}
    out[folder] = {"errors": errors, "dags": teams}
print(json.dumps(out))
"""


def test_in_a_team_s_bundle_the_pipeline_is_the_team_s_own_and_in_the_shared_one_there_is_none(tmp_path):
    team = tmp_path / "team_dags" / "vision"
    team.mkdir(parents=True)
    for name in TEAM_FILES:
        (team / name).symlink_to(REPO / "dags" / name)
    bundles = [
        {"name": "dags-folder", "classpath": LOCAL, "kwargs": {"path": str(REPO / "dags")}},
        {"name": "team-vision", "classpath": LOCAL, "kwargs": {"path": str(team)}, "team_name": "vision"},
    ]
    env = {
        **os.environ,
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
    }
    shared = [str(REPO / "dags" / name) for name in TEAM_FILES]
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(team), *shared], env=env, cwd=REPO, check=True, capture_output=True, text=True
    )
    parsed = json.loads(done.stdout.splitlines()[-1])
    assert parsed[str(team)] == {
        "errors": {},
        "dags": {"train_pipeline.vision": "vision", "promote_model.vision": None, "ingest_dataset.vision": "vision"},
    }
    for path in shared:
        assert parsed[path] == {"errors": {}, "dags": {}}  # no DAG that every team's runs would share


def test_a_job_file_whose_team_has_no_bundle_yet_is_an_import_error_that_says_what_to_do(tmp_path):
    """A team added to resources.yaml since the config was rendered has no bundle, so nothing makes its job
    files' DAGs: Airflow lists that among the import errors, naming the job file and the fix."""
    home, jobs = tmp_path / "airflow", tmp_path / "jobs"
    (home / "team_dags" / "default").mkdir(parents=True)  # team vision's bundle was never rendered
    jobs.mkdir()
    job = "retrain_on: new_commits\nname: pets\ndataset: {repo: pets, source: none}\n"
    (jobs / "mine.yaml").write_text(job + "resources: {team: default}\n")
    (jobs / "theirs.yaml").write_text(job.replace("pets", "cats") + "resources: {team: vision}\n")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "TRAINYARD_JOBS_DIR": str(jobs),
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([{"name": "dags-folder", "classpath": LOCAL}]),
    }
    errors_file = str(REPO / "dags" / "retrain_jobs_errors.py")
    done = subprocess.run(
        [sys.executable, "-c", PARSE, errors_file], env=env, cwd=REPO, check=True, capture_output=True, text=True
    )
    (error,) = json.loads(done.stdout.splitlines()[-1])[errors_file]["errors"].values()
    assert "job file 'theirs': team 'vision' has no DAG bundle yet" in error and "make setup" in error
    assert "'mine'" not in error
