"""Signed model versions and audited alias moves (promote, rollback) in the MLflow Model Registry.

Signing: every file of a version (its storage location, as MLflow resolves it for download) is hashed
into a manifest (see ``signing``) that is signed with Ed25519. Manifest, its digest, the signature and the
key fingerprint are model-version tags. The manifest is one tag ``trainyard.manifest`` when it fits in
5,000 characters, else ``trainyard.manifest.0..N-1`` plus ``trainyard.manifest_parts``: MLflow 3 stores
version tags as TEXT (validated to 100,000 characters), but servers migrated before mid-2025 and the
registered-model tag table still use VARCHAR(5000), so 5,000 works on every store. A version is signed
once: signing it again over the same content is a no-op; over different content it is refused.

Moves: ``promote`` verifies the version, moves the alias, then appends a history entry (who, when, from
which version, why). ``rollback`` picks the version that held the alias before the current one (or a named
one) and goes through ``promote``, so the same checks apply. The history is the alias moves of the audit
trail, ``$TRAINYARD_HOME/audit/audit.jsonl`` (append-only, hash-chained, locked, fsynced; ``trainyard.audit``):
the source of truth. The newest entries
that fit in 5,000 characters are mirrored onto the registered model as tag ``trainyard.alias_history``,
for a look in the MLflow UI; the mirror is best-effort and rebuilt from the file on every move.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from trainyard import paths
from trainyard.audit import RESERVED, AuditLog
from trainyard.errors import NotFoundError, PermanentError
from trainyard.files import file_lock
from trainyard.registry import card, signing
from trainyard.registry.signing import DIGEST_TAG, KEY_ID_TAG, SIGNATURE_TAG, VerificationError
from trainyard.spec import safe_key

log = logging.getLogger(__name__)

MANIFEST_TAG = "trainyard.manifest"
PARTS_TAG = "trainyard.manifest_parts"
HISTORY_TAG = "trainyard.alias_history"
TAG_LIMIT = 5000


MANAGED_ALIASES = ("staging", "production")  # trainyard moves these; every move is in the audit trail


class UnexplainedAlias(PermanentError):
    """An alias points where trainyard's history does not say it does: it was moved outside trainyard."""


class AliasMoved(PermanentError):
    """The alias moved between a move's approval and the move itself."""


_UNCHECKED = object()  # promote(): no expected holder given


class RollbackError(PermanentError):
    """There is nothing to roll back to (no earlier holder recorded, or the target already holds the alias)."""


# -- files -------------------------------------------------------------------------------------------------
def storage_uri(client, name: str, version: str) -> str:
    """Where the version's files really are. ``runs:/`` and ``models:/`` URIs are resolved first because
    downloading through them changes the file set: a ``runs:/`` download merges in the files of any logged
    model of the same name in that run, a ``models:/`` download adds a ``registered_model_meta`` file."""
    from mlflow.store.artifact.runs_artifact_repo import RunsArtifactRepository

    uri = client.get_model_version_download_uri(name, version)
    for _ in range(8):
        if uri.startswith("runs:/"):
            uri = RunsArtifactRepository.get_underlying_uri(uri, client.tracking_uri)
        elif uri.startswith("models:/"):
            ref = uri[len("models:/") :].strip("/")
            if "/" in ref:  # models:/<name>/<version>
                model, _, ver = ref.partition("/")
                uri = client.get_model_version_download_uri(model, ver)
            else:  # models:/<logged model id>
                uri = client.get_logged_model(ref).artifact_location
        else:
            return uri
    raise VerificationError(f"{name} version {version}", [f"cannot resolve its source to a storage location: {uri}"])


def _download(client, name: str, version: str, dst: Path) -> dict[str, Path]:
    import mlflow.artifacts

    uri = storage_uri(client, name, version)
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst), tracking_uri=client.tracking_uri)
    return signing.files_under(local)


def _manifest_tags(text: str) -> dict[str, str]:
    if len(text) <= TAG_LIMIT:
        return {MANIFEST_TAG: text}
    parts = [text[i : i + TAG_LIMIT] for i in range(0, len(text), TAG_LIMIT)]
    return {PARTS_TAG: str(len(parts)), **{f"{MANIFEST_TAG}.{i}": p for i, p in enumerate(parts)}}


def _stored(mv) -> tuple[dict, str] | None:
    """(manifest, signature) from a version's tags, or None if it was never signed."""
    tags = mv.tags or {}
    if SIGNATURE_TAG not in tags:
        return None
    if PARTS_TAG in tags:
        text = "".join(tags.get(f"{MANIFEST_TAG}.{i}", "") for i in range(int(tags[PARTS_TAG])))
    else:
        text = tags.get(MANIFEST_TAG, "")
    try:
        return json.loads(text), tags[SIGNATURE_TAG]
    except ValueError:
        return {}, tags[SIGNATURE_TAG]


def sign_version(client, name: str, version, private_key, *, replace: bool = False) -> dict:
    """Hash every file of ``name`` version ``version``, sign the manifest and store it as version tags.
    ``replace``: sign again with this key a version already signed over the same content by another (one
    whose key was distrusted, once someone has checked its files)."""
    version = str(version)
    mv = client.get_model_version(name, version)
    with tempfile.TemporaryDirectory(prefix="trainyard-sign-") as tmp:
        files = _download(client, name, version, Path(tmp))
        if not files:
            raise VerificationError(f"{name} version {version}", ["no files at the version's source"])
        m = signing.manifest(files, model=name, version=version, run_id=mv.run_id, source=mv.source)
    digest = signing.digest(m)
    summary = {
        "name": name,
        "version": version,
        "manifest_sha256": digest,
        "files": len(m["files"]),
        "key_id": signing.key_id(private_key),
    }
    stored = _stored(mv)
    if stored is not None:
        # (a --replace that crashed between its tags left this key's id beside the old signature: not same)
        same_key = mv.tags.get(KEY_ID_TAG) == summary["key_id"] and signing.signature_valid(
            stored[0], stored[1], private_key.public_key()
        )
        if signing.digest(stored[0]) == digest and (same_key or not replace):
            # signed before (a retry): keep that signature and its key
            return {**summary, "key_id": mv.tags.get(KEY_ID_TAG), "changed": False}
    if stored is not None and signing.digest(stored[0]) != digest:
        raise VerificationError(
            f"{name} version {version}",
            [
                f"already signed over different content (manifest {mv.tags.get(DIGEST_TAG, '?')[:12]}, "
                f"now {digest[:12]}); "
                "a registered version's files must not change: register a new version instead"
            ],
        )
    tags = {
        **_manifest_tags(signing.canonical(m).decode("utf-8")),
        DIGEST_TAG: digest,
        SIGNATURE_TAG: signing.sign(m, private_key),
        KEY_ID_TAG: summary["key_id"],
    }
    # The signature goes last: a crash part-way leaves the version unsigned, never half-signed.
    for key in sorted(tags, key=lambda k: k == SIGNATURE_TAG):
        client.set_model_version_tag(name, version, key, tags[key])
    log.info(
        "signed %s version %s: %d files, manifest %s, key %s",
        name,
        version,
        summary["files"],
        digest[:12],
        summary["key_id"],
    )
    return {**summary, "changed": True}


def verify_version(client, name: str, version, trusted: signing.Keyring) -> dict:
    """Download the version again and check it against its signed manifest, with the trusted key of the id
    it was signed with; VerificationError if it does not match, or that key is not trusted."""
    version = str(version)
    subject = f"{name} version {version}"
    mv = client.get_model_version(name, version)
    stored = _stored(mv)
    if stored is None:
        raise VerificationError(subject, ["not signed (no trainyard.signature tag): run `trainyard models sign`"])
    m, signature = stored
    kid = (mv.tags or {}).get(KEY_ID_TAG, "")
    public_key = trusted.get(kid)
    if public_key is None:
        raise VerificationError(
            subject,
            [
                f"signed with key {kid or '(no key id)'}, which is not trusted here (trusted: "
                f"{', '.join(sorted(trusted)) or 'none'}); a key that was distrusted, or one from elsewhere"
            ],
        )
    problems = []
    if m.get("model") != name or m.get("version") != version:
        problems.append(f"manifest is for {m.get('model')!r} version {m.get('version')!r}, not this version")
    if mv.tags.get(DIGEST_TAG) != signing.digest(m):
        problems.append(f"tag {DIGEST_TAG} does not match the stored manifest")
    with tempfile.TemporaryDirectory(prefix="trainyard-verify-") as tmp:
        files = _download(client, name, version, Path(tmp))
        try:
            signing.verify(m, signature, public_key, files, subject)
        except VerificationError as err:
            problems += err.problems
    if problems:
        raise VerificationError(subject, problems)
    return {
        "name": name,
        "version": version,
        "manifest_sha256": signing.digest(m),
        "files": len(m["files"]),
        "key_id": kid,
    }


# -- history -----------------------------------------------------------------------------------------------
class History:
    """The alias moves of the audit trail (``trainyard.audit``: append-only, hash-chained, one JSON object
    per line under an exclusive lock), kind ``alias_move``, actor = the user who moved it. Moves recorded
    before the trail existed (``registry/alias_history.jsonl``) are imported into it once, in order."""

    KIND = "alias_move"
    LEGACY = "registry/alias_history.jsonl"

    def __init__(self, path: str | Path | None = None):
        self.log = AuditLog(path)
        self.path = self.log.path
        if path is None:
            self._import_legacy(paths.home() / self.LEGACY)

    def _import_legacy(self, legacy: Path) -> None:
        if not legacy.exists():
            return
        moves = []
        for n, line in enumerate(legacy.read_bytes().splitlines(), 1):
            try:
                e = json.loads(line)
            except ValueError:
                log.warning("%s:%d: unreadable history line not imported", legacy, n)
                continue
            fields = {k: v for k, v in e.items() if k not in RESERVED}
            moves.append((self.KIND, str(e.get("user") or "unknown"), {**fields, "recorded_at": e.get("at")}))
        self.log.extend(
            [(k, a, {**f, "imported_from": str(legacy)}) for k, a, f in moves], unless_kind_with="imported_from"
        )
        # imported (here or by another process): set aside, so later histories do not read the trail again
        with contextlib.suppress(FileNotFoundError):
            legacy.rename(legacy.with_name(legacy.name + ".imported"))

    def append(self, entry: dict) -> dict:
        """Record a move (``user`` is its actor); returns the entry as chained, with ``at``."""
        return self.log.append(self.KIND, str(entry["user"]), **entry)

    def entries(self, name: str | None = None, alias: str | None = None) -> list[dict]:
        out = []
        for e in self.log.entries(self.KIND):
            if (name is None or e.get("model") == name) and (alias is None or e.get("alias") == alias):
                out.append({**e, "at": e.get("recorded_at") or e["at"]})
        return out


def _entries(history, name: str, alias: str | None) -> list[dict]:
    if isinstance(history, History):
        return history.entries(name, alias)
    return [e for e in history if e.get("model") == name and (alias is None or e.get("alias") == alias)]


def _mirror(client, name: str, history: History) -> None:
    from mlflow.exceptions import MlflowException

    kept: list[dict] = []
    chain = ("prev", "hash", "kind", "actor", "imported_from", "recorded_at")  # the trail's own fields
    for e in reversed([{k: v for k, v in e.items() if k not in chain} for e in history.entries(name)]):
        if len(json.dumps([e, *kept], separators=(",", ":"))) > TAG_LIMIT:
            break
        kept.insert(0, e)
    try:
        client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(kept, separators=(",", ":")))
    except MlflowException as err:
        log.warning(
            "alias history not mirrored to tag %s of %s: %s (the file %s is complete)",
            HISTORY_TAG,
            name,
            err,
            history.path,
        )


def _when(value) -> datetime:
    t = datetime.fromisoformat(value) if isinstance(value, str) else value
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def live_at(history, name: str, alias: str, when) -> str | None:
    """The version ``alias`` pointed at, at ``when`` (datetime or ISO string; naive = UTC; a bare date
    means that day's 00:00 UTC), per the recorded moves; None before the first recorded move."""
    when = _when(when)
    live = None
    for e in _entries(history, name, alias):
        if _when(e["at"]) <= when:
            live = e["to_version"]
    return live


def previous_version(entries: Iterable[dict], current: str | None) -> str | None:
    """The version that held the alias before ``current``, skipping versions that were rolled back from:
    promotions push onto a stack, a rollback pops back to its target, so rolling back twice goes two steps."""
    stack: list[str] = []
    for e in entries:
        if e.get("action") == "rollback" and e["to_version"] in stack:
            del stack[len(stack) - stack[::-1].index(e["to_version"]) :]
            continue
        if e.get("from_version") is not None and (not stack or stack[-1] != e["from_version"]):
            stack.append(e["from_version"])
        if not stack or stack[-1] != e["to_version"]:
            stack.append(e["to_version"])
    if current is not None and current in stack:
        below = stack[: len(stack) - stack[::-1].index(current) - 1]
        return below[-1] if below else None
    return None


# -- moves -------------------------------------------------------------------------------------------------
def alias_holder(client, name: str, alias: str) -> str | None:
    holder = client.get_registered_model(name).aliases.get(alias)
    return None if holder is None else str(holder)


def unexplained_aliases(client, name: str, history) -> dict[str, str]:
    """alias -> what is wrong, for each alias of ``name`` (trainyard's own, and any its history names)
    whose holder is not the one its last recorded move put there."""
    holders = {a: str(v) for a, v in client.get_registered_model(name).aliases.items()}
    recorded: dict[str, str] = {}
    for e in _entries(history, name, None):
        recorded[e["alias"]] = e["to_version"]
    aliases = sorted((set(holders) & set(MANAGED_ALIASES)) | set(recorded))
    return {
        alias: _moved_outside(name, alias, holders.get(alias), recorded.get(alias))
        for alias in aliases
        if holders.get(alias) != recorded.get(alias)
    }


def _moved_outside(name: str, alias: str, have: str | None, said: str | None) -> str:
    """Why ``alias`` is unexplained: it points at ``have``, its last recorded move put it at ``said``."""
    return (
        f"alias {alias!r} of {name!r} points at {'version ' + have if have else 'nothing'}, but trainyard's "
        f"history has it at {'version ' + said if said else 'nothing'}: it was moved outside trainyard "
        "(the MLflow UI or API)"
    )


def resolve_version(client, name: str, version: str | int | None, alias: str = "staging") -> str:
    """``version`` itself, or (when empty) the version ``alias`` points at."""
    if version not in (None, ""):
        return str(client.get_model_version(name, str(version)).version)
    holder = alias_holder(client, name, alias)
    if holder is None:
        raise NotFoundError(f"no version given and {name!r} has no {alias!r} alias; give a version number")
    return holder


def _check_source(name: str, alias: str, current: str | None, last: dict | None, action: str) -> None:
    """UnexplainedAlias when ``alias`` points somewhere its last recorded move did not put it."""
    said = last["to_version"] if last else None
    if current is not None and current != said:
        where = f"version {said}" if said else "nothing"
        raise UnexplainedAlias(
            f"{_moved_outside(name, alias, current, said)}, so it is not a source to {action} from; find out who "
            f"moved it, point it back at {where} in MLflow, then {action} again"
        )


def promote(
    client,
    name: str,
    version,
    alias: str,
    *,
    user: str,
    reason: str,
    trusted: signing.Keyring,
    history: History | None = None,
    action: str = "promote",
    extra: dict | None = None,
    expected_holder: object = _UNCHECKED,
) -> dict:
    """Verify ``version``, point ``alias`` at it, record the move. Returns the history entry plus
    ``changed`` (False when the alias already pointed there and that move is already recorded, or this
    ``extra["dag_run"]`` already made its move). ``expected_holder``: the version the alias pointed at when
    the move was verified and approved; if it has moved since, the move is refused (AliasMoved). Moves of one
    alias take a lock, so each one's ``from_version`` is exact whatever runs at once."""
    history = history or History()
    version = str(version)
    verified = verify_version(client, name, version, trusted)
    with file_lock(paths.home() / "registry" / "locks" / f"{safe_key(name)}.{alias}.lock"):
        current = alias_holder(client, name, alias)
        recorded = _entries(history, name, alias)
        last = recorded[-1] if recorded else None
        run = (extra or {}).get("dag_run")
        done = [e for e in recorded if run and e.get("dag_run") == run]
        if done:  # this run moved it already (a retry, or a cleared task of an old run): nothing moves again
            return {**done[-1], "changed": False}
        if current == version:
            if last and last["to_version"] == version:
                card.refresh(client, name, [version], history.entries(name))  # a retry: the first may have stored none
                return {**last, "changed": False}
            # Moved but not recorded (a crash between the two): record the move from the last recorded holder.
            from_version = last["to_version"] if last else None
        else:
            _check_source(name, alias, current, last, action)
            if expected_holder is not _UNCHECKED and current != expected_holder:
                raise AliasMoved(
                    f"alias {alias!r} of {name!r} points at version {current} now, not at {expected_holder} as when "
                    f"this move was verified and approved; ask for it again (a new promote_model run)"
                )
            from_version = current
        client.set_registered_model_alias(name, alias, version)
        entry = {
            "model": name,
            "alias": alias,
            "from_version": from_version,
            "to_version": version,
            "user": user,
            "reason": reason,
            "action": action,
            "manifest_sha256": verified["manifest_sha256"],
            "key_id": verified["key_id"],
            **(extra or {}),
        }
        entry = history.append(entry)
        _mirror(client, name, history)
        log.info("%s: %s alias %r %s -> %s by %s (%s)", action, name, alias, from_version, version, user, reason)
        card.refresh(client, name, [from_version, version], history.entries(name))  # both versions' history changed
        return {**entry, "changed": True}


def rollback_target(client, name: str, alias: str, to_version=None, history: History | None = None) -> str:
    """The version a rollback of ``alias`` moves to: ``to_version``, or the version that held it before the
    current one. RollbackError when there is none, or it already holds the alias; UnexplainedAlias when the
    alias was moved outside trainyard (no source to roll back from)."""
    history = history or History()
    current = alias_holder(client, name, alias)
    recorded = _entries(history, name, alias)
    _check_source(name, alias, current, recorded[-1] if recorded else None, "rollback")
    target = str(to_version) if to_version not in (None, "") else previous_version(recorded, current)
    if target is None:
        raise RollbackError(
            f"no version of {name!r} is recorded as holding {alias!r} before version {current}; "
            "name the version to roll back to"
        )
    if target == current:
        raise RollbackError(f"version {target} of {name!r} already holds {alias!r}")
    return target


def rollback(
    client,
    name: str,
    *,
    to_version=None,
    alias: str = "production",
    user: str,
    reason: str,
    trusted: signing.Keyring,
    history: History | None = None,
    extra: dict | None = None,
) -> dict:
    """Move ``alias`` back to ``to_version`` or, by default, to the version that held it before the current
    one (:func:`rollback_target`); verified like any promotion."""
    history = history or History()
    return promote(
        client,
        name,
        rollback_target(client, name, alias, to_version, history),
        alias,
        user=user,
        reason=reason,
        trusted=trusted,
        history=history,
        action="rollback",
        extra=extra,
    )
