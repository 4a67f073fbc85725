"""
### ingest_dataset

Upload a folder as a new, validated dataset version of a repository of the team (`team`: in Airflow's
multi-team mode each team has its own `ingest_dataset.<team>`, whose runs and logs only its members see).
A repository belongs to the team that first uploaded to it; another team's is refused, naming its owner.

`check_upload` (file checks + great-expectations suite for the data kind, Data Docs written) →
`commit_upload` (the same bytes, by digest, committed to the branch; the commit id is the result).

Nothing is committed when a check fails. A new commit is announced as an event on its branch's asset,
`trainyard://datasets/<store>/<repo>/<branch>` (extra: store, repo, branch, commit, digest), through the
`trainyard_dataset_commits` alias: a job file with `retrain_on: new_commits` on that branch trains again.
An upload equal to the branch's head commits nothing and announces nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, AssetAlias, Param, dag, task

from trainyard.data.kinds import KINDS
from trainyard.errors import PermanentError
from trainyard.retraining import dataset_uri
from trainyard.spec import NAME_RE
from trainyard.teams import INGEST_DAG, team_dag
from trainyard_airflow.auth import triggering_user
from trainyard_airflow.errors import fail_permanently
from trainyard_airflow.team_dags import bundle_team, makes_dags

# In Airflow's multi-team mode this file is read in every team's bundle and makes that team's own
# ingest_dataset.<team> there; in the shared bundle it makes nothing (team_dags).
TEAM = bundle_team(__file__)
# The team input: in a team's own DAG, that team only
TEAM_FIELD: dict[str, Any] = {
    "type": "string",
    "description": "The team the data is for: the repository is its own."
    + (f" This DAG uploads for team {TEAM} only." if TEAM else ""),
    **({"enum": [TEAM]} if TEAM else {}),
}

# The asset of each branch is known only when its commit is made: events go through an alias.
DATASET_COMMITS = AssetAlias("trainyard_dataset_commits")

default_args = {"owner": "trainyard", "retries": 1, "retry_delay": timedelta(seconds=10)}


def _team(params: dict) -> str:
    """The team the upload is for, once the triggering user is known to be one of its members (a run no
    person triggered acts as its team) and the DAG to be that team's."""
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import check_member_of

    team = params["team"]
    if TEAM is not None and team != TEAM:
        raise PermanentError(
            f"team: {team!r} is not the team of {team_dag(INGEST_DAG, TEAM)}; use {team_dag(INGEST_DAG, team)}"
        )
    check_member_of(resources_in_force(), team, triggering_user(), field="team", what="upload it")
    return team


def _head(params: dict) -> str | None:
    """The branch's head commit now, None for a branch or repo with no commit yet."""
    from trainyard.data.store import NotFound
    from trainyard.data.stores import open_store
    from trainyard_airflow.hooks.lakefs_hook import register_store

    register_store()
    try:
        return open_store(params["store"]).resolve(params["repo"], params["branch"])
    except NotFound:
        return None


@dag(
    dag_id=team_dag(INGEST_DAG, TEAM),
    schedule=None,
    catchup=False,
    default_args=default_args,
    tags=["trainyard", "data"],
    doc_md=__doc__,
    params={
        "folder": Param("", type="string", description="Folder on the worker to upload.", minLength=1),
        "repo": Param("digits", type="string", description="Dataset repository (the team's own).", pattern=NAME_RE),
        "team": Param(TEAM or "default", **TEAM_FIELD),
        "branch": Param("main", type="string", description="Branch to commit to."),
        "store": Param("local", enum=["local", "lakefs"], description="Dataset store backend."),
        "kind": Param(
            "auto",
            enum=["auto", *KINDS],
            description="Data kind (selects the expectation suite); auto = from the folder's files.",
        ),
        "message": Param("", type="string", description="Commit message."),
    },
)
def ingest_dataset():
    # one XCom per task, its record (multiple_outputs=False: see train_pipeline.py)
    @task(multiple_outputs=False)
    @fail_permanently
    def check_upload(params: dict | None = None) -> dict:
        """Refuse traversal, outside symlinks and empty folders; run the data kind's suite."""
        assert params is not None  # Airflow passes the run's params by name
        from trainyard import paths
        from trainyard.data.stores import open_store
        from trainyard.data.upload import collect_folder, detect_kind, folder_digest, validate_folder
        from trainyard.datasets import check_upload
        from trainyard.pipeline.data import DataValidationError
        from trainyard.spec import safe_key
        from trainyard_airflow.hooks.lakefs_hook import register_store

        register_store()
        check_upload(open_store(params["store"]), params["repo"], _team(params))  # before the work of validating
        files = collect_folder(params["folder"])
        kind = detect_kind(params["folder"]) if params["kind"] == "auto" else params["kind"]
        digest = folder_digest(files)
        docs = paths.home() / "ingest" / safe_key(f"{params['repo']}-{digest[:12]}")
        report = validate_folder(params["folder"], kind, docs_dir=docs)
        if not report.success:
            raise DataValidationError(f"{params['folder']} failed validation; nothing committed.\n{report.summary()}")
        return {
            "head": _head(params),  # what commit_upload compares with, on every try: is its commit new?
            "digest": digest,
            "kind": kind,
            "files": len(files),
            "docs": report.docs,
            "validation": report.summary(),
        }

    @task(multiple_outputs=False, outlets=[DATASET_COMMITS])
    @fail_permanently
    def commit_upload(checked: dict, params: dict | None = None, outlet_events=None) -> dict:
        """Commit exactly the validated bytes (same digest) and announce the new commit."""
        assert params is not None  # Airflow passes the run's params by name
        from trainyard.data.stores import open_store
        from trainyard.datasets import upload
        from trainyard_airflow.hooks.lakefs_hook import register_store

        register_store()

        result = upload(
            open_store(params["store"]),
            params["repo"],
            params["branch"],
            params["folder"],
            _team(params),
            kind=checked["kind"],
            message=params["message"],
            expected_digest=checked["digest"],
        )
        if result["commit"] != checked["head"]:  # new since the check (a retry's own commit included)
            branch = Asset(dataset_uri(result["store"], params["repo"], params["branch"]))
            extra = {k: result[k] for k in ("store", "repo", "branch", "commit", "digest")}
            outlet_events[DATASET_COMMITS].add(branch, extra=extra)
        return result

    # A task call returns an XComArg at parse time; the task it is passed to receives the JSON it stands for
    # at run time. `Any` says both to mypy, which still checks each call's arguments by count and name.
    checked: Any = check_upload()
    commit_upload(checked)


if makes_dags(TEAM):
    ingest_dataset_dag = ingest_dataset()  # not `dag`: that is the decorator's name

    if __name__ == "__main__":
        ingest_dataset_dag.test()
