"""The audit trail: an append-only JSON-lines file in which every entry is chained to the one before it.

Each entry carries ``seq`` (1, 2, ...), ``kind`` (``alias_move``, ...), ``actor`` (who did it), ``at``,
its own fields, ``prev`` (the hash of the entry before it; 64 zeros for the first) and ``hash``: SHA-256 of
the entry's canonical JSON without ``hash``. An edited entry no longer matches its hash, a removed or
reordered one breaks the next entry's ``prev`` or the run of ``seq``; :meth:`AuditLog.verify` names the
first entry at fault. Removing entries from the end leaves a shorter, valid chain: that is caught only
against a head recorded elsewhere (``trainyard audit verify --head HASH``, the head an earlier
``trainyard audit verify`` printed), as for any hash chain without an outside anchor.

Appends hold an exclusive ``flock`` on the file, read the last entry, and write and fsync one line, so
concurrent processes chain one after another. A writer that died mid-line leaves a torn line, which the
next append ends with a newline and chains past: :meth:`verify` reports it as torn, not as tampering,
when the chain continues from the entry before it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from trainyard import paths

GENESIS = "0" * 64
RESERVED = ("seq", "kind", "actor", "at", "prev", "hash")


def entry_hash(entry: dict) -> str:
    """SHA-256 of ``entry`` without its ``hash``, as canonical JSON (sorted keys, no spaces)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def default_path() -> Path:
    return paths.home() / "audit" / "audit.jsonl"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AuditLog:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else default_path()

    def append(self, kind: str, actor: str, **fields) -> dict:
        """Chain one entry to the end; returns it (with ``seq``, ``at``, ``prev`` and ``hash``)."""
        return self.extend([(kind, actor, fields)])[0]

    def extend(self, items: list[tuple[str, str, dict]], unless_kind_with: str | None = None) -> list[dict]:
        """Chain ``(kind, actor, fields)`` entries to the end under one lock. ``unless_kind_with``: append
        nothing if an entry already has that field (a one-time import done by another process)."""
        for _, actor, fields in items:
            clash = sorted(set(fields) & set(RESERVED))
            if clash:
                raise ValueError(f"audit fields {clash} are the trail's own; name them otherwise")
            if not actor:
                raise ValueError("an audit entry needs the acting user")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        written: list[dict] = []
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                existing = [e for _, e in _parsed(f.read().splitlines()) if e is not None]
                if unless_kind_with and any(unless_kind_with in e for e in existing):
                    return []
                last = existing[-1] if existing else None
                torn = False
                if f.seek(0, os.SEEK_END):
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
                lines = []
                for kind, actor, fields in items:
                    entry = {
                        **fields,
                        "seq": (last["seq"] + 1) if last else 1,
                        "kind": kind,
                        "actor": actor,
                        "at": datetime.now(UTC).isoformat(timespec="microseconds"),
                        "prev": last["hash"] if last else GENESIS,
                    }
                    entry["hash"] = entry_hash(entry)
                    lines.append(json.dumps(entry, sort_keys=True).encode())
                    written.append(entry)
                    last = entry
                # a writer that died mid-line left no newline: end that line so these entries stay whole
                f.write((b"\n" if torn else b"") + b"\n".join(lines) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        if new:
            _fsync_dir(self.path.parent)
        return written

    def _lines(self) -> list[bytes]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                return f.read().splitlines()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def entries(self, kind: str | None = None) -> list[dict]:
        """Every whole entry in order (torn lines skipped), of ``kind`` if given."""
        return [e for _, e in _parsed(self._lines()) if e is not None and (kind is None or e.get("kind") == kind)]

    def head(self) -> str:
        """The last entry's hash (GENESIS for an empty trail): record it elsewhere to catch a cut-off end."""
        entries = self.entries()
        return entries[-1]["hash"] if entries else GENESIS

    def verify(self, head: str | None = None) -> tuple[list[str], list[str]]:
        """(problems, notes): the entries that were edited, removed or reordered, named by line; torn lines
        (a writer that died) as notes. ``head``: a hash the trail must still contain."""
        problems: list[str] = []
        notes: list[str] = []
        prev, seq, seen_head = GENESIS, 0, head is None or head == GENESIS
        for n, entry in _parsed(self._lines()):
            where = f"{self.path}:{n}"
            if entry is None:
                notes.append(f"{where}: a torn line (a writer died mid-write); the chain continues past it")
                continue
            if entry.get("hash") != entry_hash(entry):
                problems.append(f"{where}: entry {entry.get('seq')} was edited (its hash does not match it)")
            if entry.get("prev") != prev:
                problems.append(
                    f"{where}: entry {entry.get('seq')} does not follow the entry before it "
                    "(an entry was removed, inserted or moved)"
                )
            if entry.get("seq") != seq + 1:
                problems.append(f"{where}: entry {entry.get('seq')} where {seq + 1} was due")
            if problems:
                break  # what follows a break cannot be checked against it
            prev, seq = entry["hash"], entry["seq"]
            seen_head = seen_head or prev == head
        if not seen_head and not problems:
            problems.append(
                f"{self.path}: the recorded head {head} is not in the trail: entries at its end were removed"
            )
        return problems, notes


def _parsed(lines: list[bytes]) -> Iterator[tuple[int, dict | None]]:
    """(line number, entry or None for a torn line) for every non-blank line."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            yield n, None
            continue
        yield n, entry if isinstance(entry, dict) else None
