"""``trainyard models ...``: keys, signatures, promotion, rollback and the alias history.

Commands raise on failure; ``cli_command`` turns an expected error into the one line every trainyard
command prints, and its exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainyard.errors import CommandError, NotFoundError, cli_command


def _client():
    from trainyard.tracking.mlflow_tracking import client

    return client()


def _errors() -> tuple[type[Exception], ...]:
    """The registry's and MLflow's errors that a command turns into a CommandError (one line, no traceback)."""
    from mlflow.exceptions import MlflowException

    from trainyard.registry.signing import SigningKeyError, VerificationError
    from trainyard.registry.versions import RollbackError, UnexplainedAlias

    return MlflowException, LookupError, RollbackError, SigningKeyError, UnexplainedAlias, VerificationError


def _as_command_error(err: Exception, doing: str = "") -> CommandError:
    message = getattr(err, "message", None) or str(err)  # MlflowException's str() is JSON-ish noise
    return CommandError(f"{doing}{message}")


def cmd_keygen(args) -> int:
    from trainyard.registry import signing

    try:
        private, public = (signing.ensure_keypair if args.if_missing else signing.generate_keypair)(args.dir)
    except FileExistsError as err:
        raise CommandError(f"{err}; pass --if-missing to keep the existing key pair") from err
    print(f"signing key {private} (secret, mode 0600)\nverify key  {public}", file=sys.stderr)
    print(signing.key_id(signing.load_public_key(public)))
    return 0


def cmd_keys_list(args) -> int:
    from trainyard.registry import signing

    d = Path(args.dir) if args.dir else signing.keys_dir()
    signer = d / signing.PRIVATE_NAME
    signing_id = signing.key_id(signing.load_private_key(signer)) if signer.is_file() else None
    for kid in sorted(signing.trusted_keys(d)):
        print(f"{kid}  {'signs and verifies' if kid == signing_id else 'verifies'}")
    return 0


def cmd_keys_rotate(args) -> int:
    from trainyard.registry import signing

    try:
        old, new = signing.rotate(args.dir)
    except signing.SigningKeyError as err:
        raise _as_command_error(err, "not rotated: ") from err
    print(f"signing key {old} replaced by {new}; {old} still verifies what it signed", file=sys.stderr)
    print(new)
    return 0


def cmd_keys_distrust(args) -> int:
    from trainyard.registry import signing

    try:
        signing.distrust(args.key_id, args.dir)
    except signing.SigningKeyError as err:
        raise _as_command_error(err, "not distrusted: ") from err
    print(f"key {args.key_id} is no longer trusted: versions it signed fail verification", file=sys.stderr)
    return 0


def cmd_sign(args) -> int:
    from trainyard.registry import signing, versions

    try:
        info = versions.sign_version(
            _client(), args.model, args.version, signing.load_private_key(args.key), replace=args.replace
        )
    except _errors() as err:
        raise _as_command_error(err, "not signed: ") from err
    print(json.dumps(info))
    return 0


def _check_readable(c, model: str) -> None:
    """Refuse reading ``model`` unless the command line's Airflow login may read its owning team's work."""
    from trainyard.acting import acting

    acting().check_model(c, model)


def cmd_verify(args) -> int:
    from trainyard.registry import signing, versions

    c = _client()
    _check_readable(c, args.model)
    try:
        version = versions.resolve_version(c, args.model, args.version, args.alias)
        info = versions.verify_version(c, args.model, version, signing.trusted_keys(args.key))
        moved = versions.unexplained_aliases(c, args.model, versions.History())
    except _errors() as err:
        raise _as_command_error(err, "not verified: ") from err
    print(json.dumps({**info, "unexplained_aliases": moved}))
    if moved:
        raise CommandError(
            f"version {version} verifies, but {'; '.join(moved.values())}; see 'trainyard models history "
            f"{args.model}' and 'trainyard audit verify'"
        )
    return 0


MOVE_TASKS = ("verify", "approve", "move_alias")  # their logs are followed: a refusal says why there


def _move_alias(args, conf: dict) -> int:
    """Trigger the promotion DAG of the team that owns the model (``promote_model.<team>``, or the one
    ``promote_model``) with ``conf`` as the user of the command line's Airflow login, who is whom the team
    check and the audit trail see (never a name typed here); with --wait follow it to its end."""
    from trainyard.airflow_api import api_client, require_login
    from trainyard.errors import NotFoundError
    from trainyard.registry import ownership
    from trainyard.submit import find_team_dag, submit
    from trainyard.teams import PROMOTE_DAG
    from trainyard.tracking import mlflow_tracking as mt

    login = require_login()
    owner = ownership.owner(mt.client(), args.model)
    if owner is None:
        raise NotFoundError(f"no registered model {args.model!r}")
    with api_client(login) as client:
        dag_id = find_team_dag(client, PROMOTE_DAG, owner)
        _, state = submit(client, login.url, conf, dag_id, args.wait, args.poll, streamed=MOVE_TASKS)
    return 1 if args.wait and state != "success" else 0


def cmd_promote(args) -> int:
    conf = {"model": args.model, "version": str(args.version), "alias": args.alias, "reason": args.reason}
    return _move_alias(args, {**conf, "action": "promote"})


def cmd_rollback(args) -> int:
    conf = {"model": args.model, "version": args.to_version or "", "alias": args.alias, "reason": args.reason}
    return _move_alias(args, {**conf, "action": "rollback"})


def cmd_owner(args) -> int:
    """Name the team that owns a model (an admin's act, in the audit trail), or show it."""
    from trainyard.acting import acting
    from trainyard.audit import AuditLog
    from trainyard.errors import PermanentError
    from trainyard.registry import ownership
    from trainyard.scheduling.resources import resources_in_force

    c = _client()
    try:
        if args.team is None:
            owner = ownership.owner(c, args.model)
            if owner is None:
                raise NotFoundError(f"no registered model {args.model!r}")
            acting().check_model(c, args.model)
            print(owner)
            return 0
        me = acting(required=True)  # who names an owner: an Airflow admin, by the login, never a typed name
        if not me.admin:
            raise CommandError(f"only an Airflow admin names a model's owner; {me.who()} is not one")
        if args.team not in resources_in_force().teams:
            raise CommandError(f"team {args.team!r} is not in resources.yaml; add it there first")
        before = ownership.set_owner(c, args.model, args.team, replace=args.replace)
    except _errors() + (PermanentError,) as err:
        raise _as_command_error(err, f"{args.model}: ") from None
    AuditLog().append("model_owner", str(me.user), model=args.model, team=args.team, before=before)
    print(f"model {args.model} belongs to team {args.team}" + (f" (was {before})" if before else ""))
    return 0


def cmd_history(args) -> int:
    from trainyard.registry.versions import History

    _check_readable(_client(), args.model)
    entries = History().entries(args.model, args.alias)
    if args.json:
        for e in entries:
            print(json.dumps(e))
        return 0
    for e in entries:
        print(
            f"{e['at']}  {e['alias']:<11} {str(e['from_version']):>5} -> {e['to_version']:<5} "
            f"{e.get('action', 'promote'):<8} {e['user']}: {e['reason']}"
        )
    return 0


def cmd_card(args) -> int:
    """Write the version's model card (Markdown and JSON) into ``--out`` and store it with the version."""
    from pathlib import Path

    from trainyard.registry import card
    from trainyard.registry.versions import History

    c = _client()
    _check_readable(c, args.model)
    try:
        built = card.attach(c, args.model, args.version, History().entries(args.model))
    except _errors() as err:
        raise _as_command_error(err, f"{args.model} version {args.version}: ") from None
    as_json, as_md = card.write(built, Path(args.out) / f"{args.model}-v{args.version}")
    print(f"model card of {args.model} version {args.version}: {as_md} and {as_json}")
    return 0


def cmd_live_at(args) -> int:
    from trainyard.registry.versions import History, live_at

    _check_readable(_client(), args.model)
    try:
        version = live_at(History(), args.model, args.alias, args.when)
    except ValueError as err:
        raise CommandError(
            f"bad time {args.when!r}: {err}; write it as ISO 8601, e.g. 2026-03-01T12:00:00+00:00"
        ) from err
    if version is None:
        raise NotFoundError(
            f"no recorded {args.alias!r} version of {args.model!r} at {args.when}; "
            f"see 'trainyard models history {args.model}'"
        )
    print(version)
    return 0


def _add_key_commands(sub) -> None:
    """``keygen`` and ``keys list|rotate|distrust``: the signing key pair and the trusted verify keys."""
    p = sub.add_parser("keygen", help="create an Ed25519 key pair (never overwrites one)")
    p.add_argument("--dir", help="folder for signing_key.pem and verify_key.pem (default: $TRAINYARD_HOME/keys)")
    p.add_argument("--if-missing", action="store_true", help="succeed without change if a key pair exists")
    p.set_defaults(func=cli_command(cmd_keygen))

    keys = sub.add_parser("keys", help="the signing key and the trusted verify keys: list, rotate, distrust")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    p = keys_sub.add_parser("list", help="the trusted verify keys by id, and which one signs")
    p.add_argument("--dir", help="default: $TRAINYARD_HOME/keys")
    p.set_defaults(func=cli_command(cmd_keys_list))
    p = keys_sub.add_parser("rotate", help="a new signing key; the old one's public half stays trusted")
    p.add_argument("--dir", help="default: $TRAINYARD_HOME/keys")
    p.set_defaults(func=cli_command(cmd_keys_rotate))
    p = keys_sub.add_parser("distrust", help="stop trusting a key (leaked, retired): what it signed fails")
    p.add_argument("key_id")
    p.add_argument("--dir", help="default: $TRAINYARD_HOME/keys")
    p.set_defaults(func=cli_command(cmd_keys_distrust))


def _add_move_commands(sub) -> None:
    """``promote`` and ``rollback``: an alias moved by the promote_model DAG, as the Airflow login."""
    move = argparse.ArgumentParser(add_help=False)
    move.add_argument("--alias", choices=["staging", "production"], default="production")
    move.add_argument(
        "--no-wait", dest="wait", action="store_false", help="print the promote_model run's id and return at once"
    )
    move.add_argument("--poll", type=float, default=5.0, help="seconds between looks while waiting (default 5)")
    p = sub.add_parser(
        "promote",
        parents=[move],
        help="verify a version, then point an alias at it (the promote_model DAG, as your Airflow login)",
    )
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument("--reason", required=True, help="why (recorded in the alias history)")
    p.set_defaults(func=cli_command(cmd_promote))

    p = sub.add_parser(
        "rollback",
        parents=[move],
        help="point production back at the previous (or a named) version (promote_model, as your Airflow login)",
    )
    p.add_argument("model")
    p.add_argument("--to-version", help="default: the version that held the alias before the current one")
    p.add_argument("--reason", default="rollback", help="why (recorded in the alias history)")
    p.set_defaults(func=cli_command(cmd_rollback))


def add_models_parser(sub) -> None:
    """Register ``models`` and its subcommands on the top-level parser's subparsers."""
    models = sub.add_parser("models", help="signed model versions, promotion, rollback, alias history")
    commands = models.add_subparsers(dest="models_command", required=True)
    key = argparse.ArgumentParser(add_help=False)
    key.add_argument(
        "--key", help="PEM file (default: $TRAINYARD_SIGNING_KEY / $TRAINYARD_VERIFY_KEY, else $TRAINYARD_HOME/keys/)"
    )

    _add_key_commands(commands)
    p = commands.add_parser("sign", parents=[key], help="hash a version's files and sign the manifest")
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument(
        "--replace",
        action="store_true",
        help="sign again a version signed by another key (after distrusting it; check the files first)",
    )
    p.set_defaults(func=cli_command(cmd_sign))

    p = commands.add_parser("verify", parents=[key], help="re-hash a version's files and check its signature")
    p.add_argument("model")
    p.add_argument("version", nargs="?", default="", help="default: the version under --alias")
    p.add_argument("--alias", default="staging")
    p.set_defaults(func=cli_command(cmd_verify))

    _add_move_commands(commands)

    p = commands.add_parser("owner", help="the team that owns a model; with TEAM, name it (an admin's act, audited)")
    p.add_argument("model")
    p.add_argument("team", nargs="?")
    p.add_argument("--replace", action="store_true", help="give a model another team already owns to TEAM")
    p.set_defaults(func=cli_command(cmd_owner))

    p = commands.add_parser("history", help="every recorded alias move of a model")
    p.add_argument("model")
    p.add_argument("--alias")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cli_command(cmd_history))

    p = commands.add_parser(
        "card", help="a version's model card: lineage, validation, gate, champion, signature, approvals, cost"
    )
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument("--out", default=".", help="folder for <model>-v<version>/card.md and card.json (default: .)")
    p.set_defaults(func=cli_command(cmd_card))

    p = commands.add_parser("live-at", help="the version an alias pointed at, at a time (ISO; naive = UTC)")
    p.add_argument("model")
    p.add_argument("when", help="e.g. 2026-03-01T12:00:00+00:00 (a bare date means 00:00 UTC)")
    p.add_argument("--alias", default="production")
    p.set_defaults(func=cli_command(cmd_live_at))
