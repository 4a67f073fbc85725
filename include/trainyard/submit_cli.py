"""The commands that drive Airflow runs from a terminal: ``trainyard submit`` and ``trainyard runs
status|logs|cancel`` (:mod:`trainyard.submit` does the work)."""

from __future__ import annotations

import argparse
import json
import sys

from trainyard.errors import cli_command


def cmd_submit(args) -> int:
    """Validate a JobSpec file here, trigger its team's training DAG with it; with --wait, follow it to its end."""
    from trainyard.airflow_api import api_client, require_login
    from trainyard.pipeline.spec import validate_spec
    from trainyard.spec import load_spec_file
    from trainyard.submit import find_training_dag, submit

    # what this machine can check before anything is sent; the run's first task checks it all again
    spec = validate_spec(load_spec_file(args.job).model_dump(mode="json"), audit=False)
    login = require_login()
    with api_client(login) as client:
        dag_id = args.dag or find_training_dag(client, spec.resources.team)
        conf = spec.model_dump(mode="json")
        _, state = submit(client, login.url, conf, dag_id, args.wait, args.poll, note=spec.headline())
    return 1 if args.wait and state != "success" else 0


def cmd_replay(args) -> int:
    """Train a registered version again from its record and compare the metrics (trainyard.replay)."""
    from trainyard import replay
    from trainyard.airflow_api import api_client, require_login
    from trainyard.errors import CommandError
    from trainyard.spec import JobSpec
    from trainyard.submit import find_training_dag, submit
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    rec = replay.recorded(c, args.model, args.version)
    tolerance = replay.default_tolerance(rec) if args.tolerance is None else args.tolerance
    login = require_login()
    with api_client(login) as client:
        # the training task compares its own environment with the version's (trainyard.replay)
        conf = replay.replay_conf(rec, exact=not args.allow_different)
        spec = JobSpec.model_validate(conf)
        dag_id = find_training_dag(client, spec.resources.team)
        run_id, state = submit(client, login.url, conf, dag_id, True, args.poll, note=spec.headline())
    # what evaluate logged on the run's MLflow run (also when a later task failed), not its XCom
    metrics = replay.evaluated(c, rec.spec.get("name", ""), f"{dag_id}/{run_id}")
    for line in replay.differences_of_run(c, rec.spec.get("name", ""), f"{dag_id}/{run_id}"):
        print(f"differs (allowed): {line}", file=sys.stderr)
    if not metrics:
        raise CommandError(
            f"the replay run {run_id} ended {state} without metrics (a worker whose code or dependencies differ "
            f"from the version's refuses to train: the log above says which): see `trainyard runs logs {run_id}`"
        )
    ok, table = replay.compare(rec.metrics, metrics, tolerance, rec.rounded)
    print(table)
    print(f"replay of {args.model} version {args.version}: {'reproduced' if ok else 'NOT reproduced'}")
    return 0 if ok else 1


def cmd_runs_status(args) -> int:
    from trainyard.airflow_api import api_client, require_login
    from trainyard.submit import find_run_dag, run_state

    with api_client(require_login()) as client:
        args.dag = args.dag or find_run_dag(client, args.run)
        state, tasks = run_state(client, args.dag, args.run)
    if args.json:
        print(json.dumps({"run": args.run, "dag": args.dag, "state": state, "tasks": tasks}, indent=1))
        return 0
    print(f"{args.dag}/{args.run}: {state}")
    for name, ti in tasks.items():
        print(f"  {name:<28} {ti['state']:<18} try {ti['try_number']}")
    return 0


def cmd_runs_logs(args) -> int:
    from trainyard.airflow_api import api_client, require_login
    from trainyard.errors import NotFoundError
    from trainyard.submit import LogFollower, find_run_dag, follow, run_state

    with api_client(require_login()) as client:
        args.dag = args.dag or find_run_dag(client, args.run)
        if args.follow:
            return 0 if follow(client, args.dag, args.run, out=sys.stdout, poll_s=args.poll) == "success" else 1
        _, tasks = run_state(client, args.dag, args.run)
        key = args.task if args.map_index < 0 else f"{args.task}[{args.map_index}]"
        if key not in tasks:
            raise NotFoundError(f"run {args.dag}/{args.run} has no task {key!r}; it has: {', '.join(tasks)}")
        tried = args.try_number or tasks[key]["try_number"]
        for line in LogFollower(client, args.dag, args.run).new_lines(args.task, args.map_index, tried):
            print(line)
    return 0


def cmd_runs_cancel(args) -> int:
    from trainyard.airflow_api import api_client, require_login
    from trainyard.submit import cancel, find_run_dag

    with api_client(require_login()) as client:
        args.dag = args.dag or find_run_dag(client, args.run)
        cancel(client, args.dag, args.run)
    print(f"{args.dag}/{args.run}: marked failed; its tasks stop and a job waiting for GPUs leaves the queue")
    return 0


def add_submit_parser(sub) -> None:
    p = sub.add_parser(
        "submit",
        help="validate a JobSpec file and run it through Airflow (login: AIRFLOW_API_TOKEN or the config file)",
    )
    p.add_argument("job", help="a JobSpec YAML file")
    p.add_argument("--wait", action="store_true", help="follow the run to its end; exit 0 only if it succeeded")
    p.add_argument("--dag", help=argparse.SUPPRESS)  # default: the team's training DAG
    p.add_argument("--poll", type=float, default=5.0, help="seconds between looks (default 5)")
    p.set_defaults(func=cli_command(cmd_submit))


def add_replay_parser(sub) -> None:
    p = sub.add_parser(
        "replay", help="train a registered version again from its spec and dataset commit; compare its metrics"
    )
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument(
        "--allow-different",
        action="store_true",
        help=(
            "train even where the training worker's code version or installed dependencies differ from the "
            "version's (the run records what differs, and this command prints it)"
        ),
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help="the largest absolute difference of a metric that counts as reproduced (default: 0 on CPU, 0.005 on GPUs)",
    )
    p.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cli_command(cmd_replay))


def add_run_commands(runs) -> None:
    """``status``, ``logs`` and ``cancel`` under ``trainyard runs``: an Airflow run, by its run id."""
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("run", help="the Airflow run id (what `trainyard submit` printed)")
    which.add_argument(
        "--dag", help="the DAG of the run (default: the training DAG, of those you may see, that has it)"
    )

    p = runs.add_parser("status", parents=[which], help="an Airflow run's state and its tasks'")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cli_command(cmd_runs_status))

    p = runs.add_parser("logs", parents=[which], help="a task's log (default: train's newest try), or --follow")
    p.add_argument("--task", default="train")
    p.add_argument("--map-index", type=int, default=-1, help="a mapped task's index (a sweep's trial)")
    p.add_argument("--try", dest="try_number", type=int, help="which try (default: the newest)")
    p.add_argument("--follow", action="store_true", help="states and new log lines until the run ends")
    p.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cli_command(cmd_runs_logs))

    p = runs.add_parser("cancel", parents=[which], help="mark an Airflow run failed: its tasks stop")
    p.set_defaults(func=cli_command(cmd_runs_cancel))
