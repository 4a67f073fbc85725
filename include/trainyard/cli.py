"""The ``trainyard`` command."""

from __future__ import annotations

import argparse
import json
import sys

from trainyard.data.kinds import KINDS
from trainyard.errors import EXIT_ERROR, CommandError, NotFoundError, PermanentError, cli_command
from trainyard.recipes.catalog import SOURCES

EPILOG = f"""exit status: 0 when the command did what it says; {EXIT_ERROR} on an error, reported as one line
'trainyard: error: <what is wrong and what to do>' on stderr; 2 when the command line itself cannot be
parsed. Add --debug (before the command) to see the error's traceback as well."""


def cmd_pools_sync(args) -> int:
    """Make Airflow's pools match resources.yaml: create and resize the GPU pools, delete the GPU pools the
    file no longer lists (not one that tasks hold now); idempotent. Needs the Airflow database."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    from trainyard.scheduling.resources import load_resources, pool_changes, pools

    wanted = pools(load_resources(args.resources))
    status = 0
    with create_session() as session:
        existing = {str(p.pool): p for p in Pool.get_pools(session=session)}
        current = {
            name: {"slots": p.slots, "description": p.description, "include_deferred": p.include_deferred}
            for name, p in existing.items()
        }
        for name, change, fields in pool_changes(current, wanted):
            if change == "delete":
                held = existing[name].occupied_slots(session=session)
                if held:
                    print(f"{name:20s} kept: {held} slot(s) held by queued or running tasks; sync again later")
                    status = EXIT_ERROR
                    continue
                if not args.dry_run:
                    Pool.delete_pool(name, session=session)
                print(f"{name:20s} deleted (not in the file)")
                continue
            assert fields is not None
            if change != "keep" and not args.dry_run:
                Pool.create_or_update_pool(name, session=session, **fields)
            before = current.get(name, {}).get("slots")
            resized = f" (was {before})" if change == "update" and before != fields["slots"] else ""
            verb = {"create": "created", "update": "updated", "keep": "unchanged"}[change]
            print(f"{name:20s} {verb}: {fields['slots']} slot(s){resized}")
        if args.dry_run:
            session.rollback()
    return status


def cmd_report_cost(args) -> int:
    """GPU-hours, spend, commitments and what is left of the budget, per team, for one month."""
    import time

    from trainyard import paths
    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.budgets import month_of, team_months
    from trainyard.scheduling.resources import load_resources

    fleet = load_resources(args.resources)
    month = args.month or month_of(time.time())
    rows = team_months(fleet, month, paths.runs_root(), existing_ledger(fleet))  # a report creates no ledger
    print(
        f"{'team':12s} {'month':7s} {'runs':>5s} {'tries':>5s} {'GPU-h':>9s} {'spent':>10s} {'committed':>10s} "
        f"{'budget':>10s} {'left':>10s}"
    )
    for r in rows.values():
        budget = "-" if r.budget is None else f"{r.budget:.2f}"
        left = "-" if r.left is None else f"{r.left:.2f}"
        print(
            f"{r.team:12s} {r.month:7s} {r.runs:5d} {r.tries:5d} {r.gpu_hours:9.3f} {r.spent:10.2f} "
            f"{r.committed:10.2f} {budget:>10s} {left:>10s}"
        )
    return 0


def cmd_queue(args) -> int:
    """Waiting and admitted jobs per GPU type, and why each waits: what users ask first when a job does
    not start."""
    import json
    import os

    from trainyard.acting import Acting, acting
    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.fleet_view import live_queue

    if not os.environ.get("TRAINYARD_HOME"):
        raise PermanentError("set TRAINYARD_HOME to the one the Airflow processes use: the queue lives there")
    try:
        me = acting()  # who Airflow says the login is; nobody: every job as others see it
    except CommandError as err:
        print(f"trainyard: {err}; showing the queue as to someone not logged in", file=sys.stderr)
        me = Acting()
    jobs = live_queue(existing_ledger(), me)  # no ledger where nothing was ever queued: a look creates none
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no job is waiting or admitted")
        return 0
    for gpu_type in sorted({j["gpu_type"] for j in jobs}):
        print(f"{gpu_type}:")
        print(f"  {'state':8s} {'team':10s} {'user':10s} {'GPUs':>4s} {'prio':>4s} {'waited':>8s}  run / reason")
        for j in (j for j in jobs if j["gpu_type"] == gpu_type):
            if "run" not in j:  # another team's
                print(f"  {j['state']:8s} {j['team']:10s} {'-':10s} {j['gpus']:4d} {j['priority']:4d}")
                continue
            waited = f"{j['waited_minutes']:.1f} min"
            print(
                f"  {j['state']:8s} {j['team']:10s} {j['user'] or '-':10s} {j['gpus']:4d} {j['priority']:4d} "
                f"{waited:>8s}  {j['run']}\n{'':56s}{j['reason']}" + (f"\n{'':56s}{j['start']}" if "start" in j else "")
            )
    if any("run" not in j for j in jobs):
        how = "; log in to Airflow (AIRFLOW_API_TOKEN) to see your team's in full" if me.user is None else ""
        print(f"(other teams' jobs: team, GPUs and priority only{how})")
    return 0


def cmd_queue_cancel(args) -> int:
    """Take a run's job out of the queue and mark its run failed (its team's members and admins)."""
    import os

    from trainyard.airflow_api import bearer_token, require_login
    from trainyard.scheduling.admission.ledger import existing_ledger
    from trainyard.scheduling.cancel import cancel_run

    login = require_login()  # Airflow says who you are, and marks the run failed
    if not os.environ.get("TRAINYARD_HOME"):
        raise PermanentError("set TRAINYARD_HOME to the one the Airflow processes use: the queue lives there")
    ledger = existing_ledger(read_only=False)
    if ledger is None:
        raise NotFoundError(f"run {args.run} is not in the queue: no job was ever queued here")
    print(cancel_run(ledger, ledger.config, args.dag, args.run, api_url=login.url, token=bearer_token(login)))
    return 0


def cmd_report_utilisation(args) -> int:
    """Utilisation per pool and team, queue waits by job size, borrowing and violations, from Airflow's
    task records (trainyard.scheduling.utilisation defines each figure)."""
    import time
    from pathlib import Path

    from trainyard.scheduling.resources import load_resources
    from trainyard.scheduling.utilisation import allocations_from_airflow, chart, check_types, format_report, report

    fleet = load_resources(args.resources)
    until = args.until if args.until is not None else time.time()
    since = args.since if args.since is not None else until - 24 * 3600
    if since >= until:
        raise PermanentError(f"the window is empty: --since must be before --until ({since:.0f} >= {until:.0f})")
    try:
        types = check_types(fleet, args.type)
    except ValueError as err:
        raise PermanentError(f"{err}; pass --type with GPU types of the resources file") from None
    allocations = allocations_from_airflow(since, until)
    rep = report(fleet, allocations, since, until, types, args.tolerance)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=1))
    else:
        print(format_report(rep))
    if args.png:
        print(f"chart: {chart(rep, allocations, Path(args.png))}", file=sys.stderr)
    return 0


def cmd_sandbox_setup(args) -> int:
    """Create the sandbox users custom commands run as, and close trainyard's and Airflow's state to others."""
    from trainyard.training.launchers import sandbox

    for line in sandbox.setup():
        print(line)
    return cmd_sandbox_check(args)


def cmd_sandbox_check(args) -> int:
    """Say whether this host can run custom commands (only sandboxed, locally), and if not, why."""
    from trainyard.training.launchers import sandbox

    reason = sandbox.unavailable_reason()
    if reason:
        raise PermanentError(f"custom commands cannot run locally on this host: {reason}")
    print(f"sandbox ready: {len(sandbox.users())} users ({sandbox.USER_PREFIX}0...), custom commands run locally")
    return 0


def cmd_audit_verify(args) -> int:
    """Check the audit trail's chain: every entry whole, in order, none removed (and ``--head`` still in it)."""
    from trainyard.audit import AuditLog

    trail = AuditLog(args.path)
    problems, notes = trail.verify(args.head)
    for note in notes:
        print(f"note: {note}")
    if problems:
        for problem in problems:
            print(f"TAMPERED: {problem}")
        raise PermanentError(
            f"the audit trail {trail.path} was changed outside trainyard ({len(problems)} problem(s) above); "
            "restore it from a backup and find out who could write it"
        )
    entries = trail.entries()
    print(f"{trail.path}: {len(entries)} entries, chain intact; head {trail.head()}")
    return 0


def cmd_audit_log(args) -> int:
    from trainyard.audit import AuditLog

    for entry in AuditLog(args.path).entries(args.kind)[-args.last :]:
        print(json.dumps(entry, sort_keys=True))
    return 0


def cmd_cluster_manifests(args) -> int:
    """The fleet's Kubernetes objects (namespaces, quotas, priority classes, Kueue) as YAML for kubectl."""
    import yaml

    from trainyard.scheduling.cluster import manifests
    from trainyard.scheduling.resources import load_resources

    print(yaml.safe_dump_all(manifests(load_resources(args.resources)), sort_keys=False), end="")
    return 0


def cmd_pools(args) -> int:
    from trainyard.scheduling.resources import load_resources, pools

    result = pools(load_resources(args.resources))
    if args.format == "airflow":
        print(json.dumps(result, indent=1))
    else:
        for name, pool in result.items():
            print(f"{name:20s} {pool['slots']:4d}  {pool['description']}")
    return 0


def cmd_validate(args) -> int:
    from trainyard.pipeline.spec import validate_spec
    from trainyard.spec import load_spec_file

    # a check writes nothing: no audit entry, no ledger (SpecError: cli_command reports it)
    spec = validate_spec(load_spec_file(args.job).model_dump(mode="json"), audit=False)
    print(spec.model_dump_json(indent=1))
    return 0


def cmd_show(args) -> int:
    """Where a model's results are: its staging version, metrics, lineage, files and UIs."""
    from mlflow.exceptions import MlflowException

    from trainyard import paths
    from trainyard.acting import acting
    from trainyard.registry.ownership import owner_or_none
    from trainyard.tracking.mlflow_tracking import RUN_KEY_TAG, client

    c = client()
    acting().check_model(c, args.model)
    try:
        mv = c.get_model_version_by_alias(args.model, args.alias)
    except MlflowException as err:
        raise NotFoundError(
            f"no version of {args.model!r} has alias {args.alias!r} ({err.message}); "
            f"see 'trainyard models history {args.model}'"
        ) from err
    run = c.get_run(mv.run_id)
    tags = mv.tags
    print(f"model            {mv.name} version {mv.version} (alias {args.alias})")
    print(f"owned by team    {owner_or_none(c, mv.name) or '(not recorded)'}")
    for key in sorted(k for k in tags if k.startswith("metric.")):
        print(f"  {key[7:]:<15}{tags[key]}")
    print(f"recipe           {tags.get('recipe')}")
    print(f"gate             {'passed' if tags.get('gate.passed') == 'true' else tags.get('gate.passed', '?')}")
    for key in sorted(k for k in tags if k.startswith(("gate.threshold.", "gate.champion."))):
        print(f"  {key[5:]:<30}{tags[key]}")
    for key in sorted(k for k in tags if k.startswith("eval.")):
        print(f"{key[5:]:<17}{tags[key]}")
    print(f"dataset          {tags.get('dataset.store')}:{tags.get('dataset.repo')}@{tags.get('dataset.commit')}")
    print(f"code version     {tags.get('code_version')}")
    print(f"airflow run      {tags.get(RUN_KEY_TAG)}")
    print(f"ONNX file        {tags.get('onnx_path')}")
    print(f"run directory    {tags.get('run_dir')}")
    print(f"MLflow run       {run.info.run_id} (experiment {run.info.experiment_id})")
    print(f"MLflow store     {paths.mlflow_tracking_uri()}")
    print("UIs              make up  (Airflow http://localhost:8080, MLflow http://localhost:5000)")
    print(f"TensorBoard      tensorboard --logdir {paths.tensorboard_root()}")
    return 0


def _store(args):
    from trainyard.data.stores import open_store

    return open_store(args.store)


def _upload_team(args, me) -> str:
    """The team an upload is for: ``--team`` (one the acting user is a member of, or any for an admin), else
    the user's one team."""
    from trainyard.scheduling.resources import resources_in_force
    from trainyard.teams import check_member_of

    if args.team:
        if not me.admin:
            check_member_of(resources_in_force(), args.team, me.user, field="--team", what="upload it")
        return args.team
    if len(me.teams) == 1:
        return me.teams[0]
    raise PermanentError(
        f"user {me.user!r} is a member of "
        + (f"teams {', '.join(me.teams)}: say which with --team" if me.teams else "no team: ask to be added to one")
    )


def cmd_data_upload(args) -> int:
    from trainyard.acting import acting
    from trainyard.airflow_api import announce_commit, find_login
    from trainyard.datasets import upload

    team = _upload_team(args, acting(required=True))  # whose the data is: the login's team, never a claimed name
    result = upload(_store(args), args.repo, args.branch, args.folder, team, kind=args.kind, message=args.message)
    print(result["validation"], file=sys.stderr)
    if not result["new_commit"]:
        print(f"{args.folder} equals the head of {args.repo}/{args.branch}: nothing new to commit", file=sys.stderr)
    else:
        print(
            f"committed {result['files']} files to {args.repo}/{args.branch} (team {team}): {result['commit']}",
            file=sys.stderr,
        )
        # the retraining jobs of this branch hear of it as they do from the ingest_dataset DAG; the commit
        # stands whatever Airflow answers, so a refused announcement is a warning, not the command's failure
        try:
            login = find_login()
            said = announce_commit(login, result) if login else "no Airflow login (AIRFLOW_API_TOKEN, see README)"
        except CommandError as err:
            said = f"warning: {err}"
        if not said.startswith("announced"):
            said += ": the commit was not announced, no retraining starts from it"
        print(said, file=sys.stderr)
    print(result["commit"])
    return 0


def cmd_data_import(args) -> int:
    """Convert an annotation tool's export or an image tree into the dataset layout, then validate it."""
    from trainyard.data.upload import validate_folder

    if args.format in ("coco", "labelstudio", "csv") and not args.images:
        raise PermanentError(f"trainyard data import {args.format} needs --images (the folder the files are in)")
    if args.format == "coco":
        from trainyard.data.importers.coco import import_coco

        summary, kind = import_coco(args.export, args.images, args.dest), "coco_detection"
    elif args.format == "labelstudio":
        from trainyard.data.importers.labelstudio import import_labelstudio

        summary = import_labelstudio(args.export, args.images, args.dest, args.kind)
        kind = "coco_detection" if args.kind == "detection" else "image_classification"
    elif args.format == "image-folder":
        from trainyard.data.importers.image_folder import import_image_folder

        summary, kind = import_image_folder(args.export, args.dest), "image_folder"
    else:
        from trainyard.data.importers.image_folder import import_labels_csv

        summary, kind = import_labels_csv(args.export, args.images, args.dest), "image_folder"
    report = validate_folder(args.dest, kind)
    print(json.dumps(summary))
    print(report.summary(), file=sys.stderr)
    if not report.success:
        raise PermanentError(
            f"{args.dest} failed the {kind} suite (report above); fix the labels in the "
            "annotation tool and export again"
        )
    print(f"ready to upload: trainyard data upload {args.dest} --repo <name>", file=sys.stderr)
    return 0


def cmd_data_log(args) -> int:
    """The ref's history, newest first, as ``git log`` and ``lakectl log`` print it (``-n``: at most N)."""
    store = _readable_store(args)
    commit = store.get_commit(args.repo, args.ref)
    shown = 0
    while args.max_count is None or shown < args.max_count:
        print(f"{commit.id}  {commit.message}  {json.dumps(commit.metadata, sort_keys=True)}")
        shown += 1
        if not commit.parents:
            break
        commit = store.get_commit(args.repo, commit.parents[0])
    return 0


def _readable_store(args):
    """The store of ``args``, after checking that the caller may read ``args.repo`` in it."""
    from trainyard.acting import acting
    from trainyard.datasets import check_read

    me, store = acting(), _store(args)
    check_read(store, args.repo, list(me.teams), admin=me.admin)
    return store


def cmd_data_tag(args) -> int:
    from trainyard.acting import acting
    from trainyard.datasets import check_tag

    me, store = acting(required=True), _store(args)
    check_tag(store, args.repo, list(me.teams), admin=me.admin)
    print(store.tag(args.repo, args.tag, args.ref))
    return 0


def cmd_data_owner(args) -> int:
    """Say whose a repository is; with TEAM or --source, record it (an Airflow admin's act)."""
    from trainyard.data import ownership

    if args.team is None and args.source is None:
        found = ownership.owner(_readable_store(args), args.repo)
        print("(no such repository)" if found is None else found.describe())
        return 0
    from trainyard.acting import acting
    from trainyard.audit import AuditLog
    from trainyard.scheduling.resources import resources_in_force

    store, me = _store(args), acting(required=True)
    if not me.admin:
        raise PermanentError(f"only an Airflow admin names a dataset repository's owner; {me.user!r} is not one")
    if args.team and args.team not in resources_in_force().teams:
        raise PermanentError(f"team {args.team!r} is not in resources.yaml; add it there first")
    before = ownership.set_owner(store, args.repo, args.team or "", source=args.source, replace=args.replace)
    AuditLog().append(
        "dataset_owner", str(me.user), store=store.kind, repo=args.repo, team=args.team, source=args.source,
        before=before.describe() if before else None,
    )  # fmt: skip
    after = ownership.owner(store, args.repo)
    print(f"{args.repo}: {before.describe() if before else 'no owner'} -> {after.describe() if after else '?'}")
    return 0


def cmd_data_ls(args) -> int:
    for e in _readable_store(args).list(args.repo, args.ref, args.prefix):
        print(f"{e.sha256[:12]}  {e.size:>10}  {e.path}")
    return 0


def _repo_hint(args, err: Exception) -> str:
    """What to do about a missing repository or ref, which the store's message alone does not say."""
    if not isinstance(err, NotFoundError):
        return ""
    return (
        f"; see what exists with 'trainyard data log --store {args.store} --repo {args.repo}', "
        f"or create it with 'trainyard data upload <folder> --store {args.store} --repo {args.repo}'"
    )


def _month(text: str) -> str:
    import re

    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a month; write it as YYYY-MM, e.g. 2026-12")
    return text


def _moment(text: str) -> float:
    """An ISO 8601 date or time (UTC unless it says otherwise) as epoch seconds."""
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date or time; write it as ISO 8601, e.g. 2026-12-01 or 2026-12-01T09:30"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


RESOURCES_HELP = "path to resources.yaml (default: $TRAINYARD_CONFIG_DIR/resources.yaml, else include/config's)"


def _resources_option(p: argparse.ArgumentParser, **kwargs) -> None:
    p.add_argument("--resources", help=RESOURCES_HELP, **kwargs)


def add_pools_parser(sub) -> None:
    p = sub.add_parser("pools", help="the Airflow pools that resources.yaml defines ('sync' makes Airflow match)")
    p.add_argument("--format", choices=["airflow", "table"], default="table")
    _resources_option(p)
    p.set_defaults(func=cli_command(cmd_pools))
    sync = p.add_subparsers(dest="pools_command").add_parser(
        "sync", help="create, resize and delete Airflow's GPU pools to match the file"
    )
    # SUPPRESS: `pools --resources F sync` and `pools sync --resources F` both keep F
    _resources_option(sync, default=argparse.SUPPRESS)
    sync.add_argument("--dry-run", action="store_true", help="print the changes without making them")
    sync.set_defaults(func=cli_command(cmd_pools_sync))


def add_cluster_parser(sub) -> None:
    cluster = sub.add_parser("cluster", help="the fleet on Kubernetes").add_subparsers(
        dest="cluster_command", required=True
    )
    p = cluster.add_parser(
        "manifests", help="namespaces, quotas, priority classes and Kueue queues from resources.yaml, for kubectl"
    )
    _resources_option(p)
    p.set_defaults(func=cli_command(cmd_cluster_manifests))


def add_queue_parser(sub) -> None:
    p = sub.add_parser("queue", help="waiting and admitted jobs per GPU type, and why each waits")
    p.add_argument("--json", action="store_true", help="one JSON object per job instead of the table")
    p.set_defaults(func=cli_command(cmd_queue))
    p = p.add_subparsers(dest="queue_command").add_parser(
        "cancel", help="take a run's job out of the queue and mark its run failed (AIRFLOW_API_TOKEN or a login)"
    )
    p.add_argument("run", help="the run id (dag_run_id), as `trainyard queue` shows it after the DAG's name")
    p.add_argument("--dag", help="the DAG of the run (default: the one whose queued job it is)")
    p.set_defaults(func=cli_command(cmd_queue_cancel))


def add_report_parser(sub) -> None:
    from trainyard.scheduling.utilisation import HANDOVER_S

    report = sub.add_parser("report", help="what the fleet was used for").add_subparsers(
        dest="report_command", required=True
    )
    p = report.add_parser("cost", help="GPU-hours and cost per team for a month, against its budget")
    p.add_argument("--month", help="YYYY-MM (default: this month, UTC)", type=_month)
    _resources_option(p)
    p.set_defaults(func=cli_command(cmd_report_cost))
    p = report.add_parser(
        "utilisation", help="GPU utilisation per pool and team, queue waits by job size, borrowing (from Airflow)"
    )
    p.add_argument("--since", type=_moment, help="start of the window, ISO 8601 (default: --until less 24 h)")
    p.add_argument("--until", type=_moment, help="end of the window, ISO 8601 (default: now)")
    p.add_argument("--type", action="append", help="a GPU type in the fleet figure (repeat; default: every type)")
    p.add_argument("--png", help="also draw utilisation over time, stacked by team, into this PNG file")
    p.add_argument(
        "--tolerance",
        type=float,
        default=HANDOVER_S,
        help="seconds a limit may look exceeded at a stretch (a job's slots handed to the next one a moment "
        "before Airflow records the first's end) before it is a violation (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    _resources_option(p)
    p.set_defaults(func=cli_command(cmd_report_utilisation))


def add_audit_parser(sub) -> None:
    audit = sub.add_parser("audit", help="the tamper-evident audit trail").add_subparsers(
        dest="audit_command", required=True
    )
    trail = argparse.ArgumentParser(add_help=False)
    trail.add_argument("--path", help="the trail (default: $TRAINYARD_HOME/audit/audit.jsonl)")
    p = audit.add_parser("verify", parents=[trail], help="check that no entry was edited, removed or reordered")
    p.add_argument("--head", help="a head hash printed earlier: also catches entries cut off the end")
    p.set_defaults(func=cli_command(cmd_audit_verify))
    p = audit.add_parser("log", parents=[trail], help="the newest entries, as JSON lines")
    p.add_argument("--kind", help="only entries of this kind (alias_move, ...)")
    p.add_argument("--last", type=int, default=50, help="how many (default 50)")
    p.set_defaults(func=cli_command(cmd_audit_log))


def add_sandbox_parser(sub) -> None:
    sandbox = sub.add_parser("sandbox", help="the OS users custom commands run as locally").add_subparsers(
        dest="sandbox_command", required=True
    )
    p = sandbox.add_parser("setup", help="create the sandbox users, close trainyard's state to others (root)")
    p.set_defaults(func=cli_command(cmd_sandbox_setup))
    p = sandbox.add_parser("check", help="can custom commands run on this host, and if not, why")
    p.set_defaults(func=cli_command(cmd_sandbox_check))


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="validate a JobSpec YAML file and print it with defaults filled in")
    p.add_argument("job")
    p.set_defaults(func=cli_command(cmd_validate))


def add_data_parser(sub) -> None:
    data = sub.add_parser("data", help="versioned datasets").add_subparsers(dest="data_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", choices=["local", "lakefs"], default="local")
    common.add_argument("--repo", required=True)
    at_ref = argparse.ArgumentParser(add_help=False)
    at_ref.add_argument("--ref", default="main")
    p = data.add_parser("upload", parents=[common], help="validate a folder and commit it as a new version")
    p.add_argument("folder")
    p.add_argument("--branch", default="main")
    p.add_argument("--kind", default="auto", choices=["auto", *KINDS])
    p.add_argument("--message", default="")
    p.add_argument("--team", help="the team the data is for (default: the Airflow login's one team)")
    p.set_defaults(func=cli_command(cmd_data_upload))
    p = data.add_parser(
        "import", help="convert a COCO or Label Studio export, an image tree or a CSV of labels into a dataset folder"
    )
    p.add_argument("format", choices=["coco", "labelstudio", "image-folder", "csv"])
    p.add_argument(
        "export",
        help="the exported JSON file; for image-folder the folder (<class>/<image> or <split>/<class>/<image>); "
        "for csv the file,label CSV",
    )
    p.add_argument("--images", help="folder with the images the export or CSV refers to")
    p.add_argument("--dest", required=True, help="new (or empty) folder to write the dataset to")
    p.add_argument(
        "--kind",
        choices=["detection", "classification"],
        default="detection",
        help="Label Studio only: what the labelling project produced",
    )
    p.set_defaults(func=cli_command(cmd_data_import))
    p = data.add_parser("log", parents=[common, at_ref], help="the history of a ref, newest first")
    p.add_argument("-n", "--max-count", type=int, metavar="N", help="at most N commits (default: all)")
    p.set_defaults(func=cli_command(cmd_data_log, _repo_hint))
    p = data.add_parser("tag", parents=[common, at_ref], help="tag a commit")
    p.add_argument("tag")
    p.set_defaults(func=cli_command(cmd_data_tag, _repo_hint))
    p = data.add_parser("ls", parents=[common, at_ref], help="files at a ref")
    p.add_argument("--prefix", default="")
    p.set_defaults(func=cli_command(cmd_data_ls, _repo_hint))
    p = data.add_parser(
        "owner", parents=[common], help="whose a repository is; an admin names it with TEAM or --source"
    )
    owner = p.add_mutually_exclusive_group()
    owner.add_argument("team", nargs="?", help="the team that owns the repository from now on")
    owner.add_argument("--source", choices=sorted(SOURCES), help="a built-in source's data: every team's to read")
    p.add_argument("--replace", action="store_true", help="change an owner already recorded")
    p.set_defaults(func=cli_command(cmd_data_owner, _repo_hint))


def add_show_parser(sub) -> None:
    p = sub.add_parser("show", help="where a registered model's results are")
    p.add_argument("model")
    p.add_argument("--alias", default="staging")
    p.set_defaults(func=cli_command(cmd_show))


def add_runs_parser(sub) -> None:
    """``trainyard runs``: finding and comparing runs in MLflow (:mod:`trainyard.tracking.cli`), and an
    Airflow run's status, logs and cancel (:mod:`trainyard.submit_cli`)."""
    from trainyard.submit_cli import add_run_commands
    from trainyard.tracking.cli import add_tracking_commands

    runs = sub.add_parser(
        "runs", help="training runs: find, filter and compare them (MLflow); an Airflow run's status, logs, cancel"
    ).add_subparsers(dest="runs_command", required=True)
    add_run_commands(runs)
    add_tracking_commands(runs)


def build_parser() -> argparse.ArgumentParser:
    """Every command group adds itself, as ``add_<group>_parser(subparsers)`` (those of a room of their own
    live there: submit and replay in :mod:`trainyard.submit_cli`, models in :mod:`trainyard.registry.cli`, the
    worker in :mod:`trainyard.scheduling.worker`)."""
    from trainyard.registry.cli import add_models_parser
    from trainyard.scheduling.worker import add_worker_parser
    from trainyard.submit_cli import add_replay_parser, add_submit_parser

    parser = argparse.ArgumentParser(
        prog="trainyard",
        description="trainyard: AI training on Apache Airflow",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too")
    sub = parser.add_subparsers(dest="command", required=True)
    groups = [add_pools_parser, add_cluster_parser, add_queue_parser, add_report_parser, add_audit_parser]
    groups += [add_sandbox_parser, add_validate_parser, add_data_parser, add_show_parser, add_submit_parser]
    groups += [add_replay_parser, add_models_parser, add_runs_parser, add_worker_parser]
    for add in groups:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    from trainyard.training.launchers.sandbox import private_umask

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep command output readable
    private_umask()  # what the CLI writes into trainyard's state is closed to others, as the workers' is
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("trainyard: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
