"""The shared database, and where the admission ledger keeps its rows: a SQLite file on this host (the
embedded default) or a PostgreSQL database every host reaches (``TRAINYARD_DATABASE_URL``, the cluster
profile; the sweeps' studies live there too). One interface, two stores; the ledger's rules
(:mod:`trainyard.scheduling.admission.ledger`) are the same SQL on both.

Both give the ledger what its decisions need:

- **one decision at a time**: a transaction that no other decision interleaves with. SQLite takes its
  database's write lock at ``BEGIN IMMEDIATE``; PostgreSQL locks the one row of ``ledger_lock``
  (``SELECT ... FOR UPDATE``) first, so decisions from any number of hosts queue on that row lock, and
  each statement after it sees what the decisions before it committed (READ COMMITTED);
- **one clock for leases**: on SQLite, this host's; on PostgreSQL, the database server's
  (``clock_timestamp()``), so hosts whose clocks drift apart still agree on whose lease ran out;
- **a store that cannot be reached for a moment is not a failure of the job**: a lock held past its
  timeout, a server restarting, a dropped connection all raise :class:`DatabaseUnavailable` (retryable);
  the trigger looks again at its next tick, the heartbeat at its next beat, a task on its retry.

A store is named by where it is: a filesystem path (SQLite) or a ``postgresql://`` URL (``postgresql+psycopg2://``
is taken too, as Airflow and MLflow write it).

A store opened **read-only** (the reports: ``trainyard queue``, the Jobs and Fleet pages, the cost report)
changes nothing, its schema included: SQLite opens the file with ``mode=ro`` and PostgreSQL's sessions are
``default_transaction_read_only``. A store where no ledger was ever made is :class:`LedgerAbsent` (nothing
queued: an empty queue to a report), and a ledger made by an earlier version is refused with
:class:`LedgerOutdated` (the next admission brings it up to date) rather than altered with the reader's
rights. (SQLite still writes its WAL index beside the file when no writer has it open: a reader of a SQLite
ledger needs to write in its folder, which a PostgreSQL reader does not.)
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from trainyard.errors import RetryableError

# The ledger's tables. Times are epoch seconds in double precision (SQLite reads the type as REAL);
# "user" is quoted: PostgreSQL reserves the word.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS arrivals (id TEXT PRIMARY KEY, enqueued DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS cancelled (id TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL, reason TEXT NOT NULL)",
    # a job's preemptions, kept apart from its row as its arrival is (a row whose lease ran out goes)
    "CREATE TABLE IF NOT EXISTS preempted (id TEXT PRIMARY KEY, times INTEGER NOT NULL, at DOUBLE PRECISION NOT NULL)",
    """CREATE TABLE IF NOT EXISTS admission (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    gpu_type TEXT NOT NULL,
    slots INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    max_hours DOUBLE PRECISION NOT NULL,
    enqueued DOUBLE PRECISION NOT NULL,
    admitted DOUBLE PRECISION,
    borrowed INTEGER NOT NULL DEFAULT 0,
    devices TEXT NOT NULL DEFAULT '',
    lease_until DOUBLE PRECISION NOT NULL,
    "user" TEXT NOT NULL DEFAULT '',
    grp TEXT NOT NULL DEFAULT '',
    grp_limit INTEGER NOT NULL DEFAULT 0,
    host TEXT NOT NULL DEFAULT '',
    preemptions INTEGER NOT NULL DEFAULT 0,
    preempted_for TEXT NOT NULL DEFAULT '',
    waiting_since DOUBLE PRECISION NOT NULL DEFAULT 0,
    told_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    told_wait DOUBLE PRECISION NOT NULL DEFAULT 0,
    nodes INTEGER NOT NULL DEFAULT 1
)""",
    # how long each finished job held its slots, as a share of its max_hours: the start estimates' history
    "CREATE TABLE IF NOT EXISTS holds (id TEXT PRIMARY KEY, team TEXT NOT NULL, share DOUBLE PRECISION NOT NULL, "
    "at DOUBLE PRECISION NOT NULL)",
    # how each admitted job's real wait came out against the wait it was told: the estimates' band
    "CREATE TABLE IF NOT EXISTS wait_ratios (id TEXT PRIMARY KEY, ratio DOUBLE PRECISION NOT NULL, "
    "at DOUBLE PRECISION NOT NULL)",
    # the worker hosts and the GPU types each serves, with its devices ('' for a type whose slots are no
    # devices), announced while the worker runs (trainyard worker): a type no live host serves waits
    "CREATE TABLE IF NOT EXISTS hosts (host TEXT NOT NULL, gpu_type TEXT NOT NULL, devices TEXT NOT NULL, "
    "seen_until DOUBLE PRECISION NOT NULL, PRIMARY KEY (host, gpu_type))",
    # every decision drops what ran out by time: indexed, its cost does not grow with the history (named
    # for the ledger: the database may hold other tables, the sweeps' studies)
    "CREATE INDEX IF NOT EXISTS ledger_arrivals_enqueued ON arrivals (enqueued)",
    "CREATE INDEX IF NOT EXISTS ledger_cancelled_at ON cancelled (at)",
    "CREATE INDEX IF NOT EXISTS ledger_preempted_at ON preempted (at)",
    "CREATE INDEX IF NOT EXISTS ledger_holds_at ON holds (at)",
    "CREATE INDEX IF NOT EXISTS ledger_admission_lease_until ON admission (lease_until)",
    "CREATE INDEX IF NOT EXISTS ledger_wait_ratios_at ON wait_ratios (at)",
    "CREATE INDEX IF NOT EXISTS ledger_hosts_seen_until ON hosts (seen_until)",
    # each node of an admitted multi-node job: the host it runs on and the devices it holds there, and node
    # 0's rendezvous endpoint (address:port) for the others to join; gone with the job's admission
    "CREATE TABLE IF NOT EXISTS job_nodes (id TEXT NOT NULL, node INTEGER NOT NULL, host TEXT NOT NULL, "
    "devices TEXT NOT NULL DEFAULT '', endpoint TEXT NOT NULL DEFAULT '', PRIMARY KEY (id, node))",
    # each stint a preempted job held its slots, from its admission to its requeue (admission.ledger.Stint)
    "CREATE TABLE IF NOT EXISTS stints (id TEXT NOT NULL, team TEXT NOT NULL, gpu_type TEXT NOT NULL, "
    "slots INTEGER NOT NULL, admitted DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (id, admitted))",
    "CREATE INDEX IF NOT EXISTS ledger_stints_ended ON stints (ended)",
)
# The last of SCHEMA: a PostgreSQL ledger that has it (and ADDED_COLUMNS' last) is made to this version
NEWEST_SCHEMA_OBJECT = "ledger_stints_ended"
# Columns a ledger made by an earlier version may lack, with the value its rows get (devices allocated, users
# shown, sweeps capped, the host whose devices a job holds, preemptions, the wait a job was told, its nodes).
ADDED_COLUMNS = (
    ("devices", "TEXT", "''"),
    ("user", "TEXT", "''"),
    ("grp", "TEXT", "''"),
    ("grp_limit", "INTEGER", "0"),
    ("host", "TEXT", "''"),
    ("preemptions", "INTEGER", "0"),
    ("preempted_for", "TEXT", "''"),
    ("waiting_since", "DOUBLE PRECISION", "0"),
    ("told_at", "DOUBLE PRECISION", "0"),
    ("told_wait", "DOUBLE PRECISION", "0"),
    ("nodes", "INTEGER", "1"),
)


class DatabaseUnavailable(RetryableError):
    """The ledger's store or the shared database cannot be reached or locked now (a lock held past its
    timeout, a database that restarts, a connection dropped): try again later; nothing was decided."""


class LedgerAbsent(DatabaseUnavailable):
    """A read-only look at a store where no ledger was ever made (a new cluster's empty database): no job
    was ever queued there."""

    def __init__(self, where: str) -> None:
        super().__init__(f"no admission ledger in {where} yet: no job was ever queued there")


class LedgerOutdated(DatabaseUnavailable):
    """A read-only look at a ledger made by an earlier version of trainyard, which lacks tables or columns
    this one reads; the next admission (any job's ``admit`` task, with the writer's rights) adds them."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"the admission ledger {where} was made by an earlier version of trainyard and a report does not "
            "alter it: the next job's admission (its `admit` task) brings it up to date; look again then"
        )


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, params: tuple = ..., /) -> Cursor: ...


class LedgerDb(Protocol):
    """What the ledger asks of its store. SQL uses ``?`` placeholders and the SQL both engines share."""

    where: str

    def connection(self) -> contextlib.AbstractContextManager[Connection, Any]:
        """A connection whose every statement commits by itself: reads for reports."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[Connection, Any]:
        """One decision: no other decision runs until it commits; rolled back on any exception."""
        ...

    def now(self, conn: Connection) -> float:
        """The time leases are judged by, in epoch seconds."""
        ...


class SqliteDb:
    """A SQLite file (WAL journal) shared by the processes of one host. It must be on a local disk:
    SQLite's locking does not hold on network filesystems."""

    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.read_only = read_only
        if read_only:
            with self.connection() as conn:
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master").fetchall()}
                columns = {row[1] for row in conn.execute("PRAGMA table_info(admission)").fetchall()}
            if "admission" not in tables:
                raise LedgerAbsent(self.where)
            if NEWEST_SCHEMA_OBJECT not in tables or ADDED_COLUMNS[-1][0] not in columns:
                raise LedgerOutdated(self.where)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connection() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in SCHEMA:
                conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(admission)").fetchall()}
            for column, kind, default in ADDED_COLUMNS:
                if column not in columns:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process added it meanwhile
                        conn.execute(f'ALTER TABLE admission ADD COLUMN "{column}" {kind} NOT NULL DEFAULT {default}')

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        try:
            if self.read_only:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                conn = sqlite3.connect(uri, timeout=60, isolation_level=None, uri=True)
            else:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        except sqlite3.OperationalError as err:
            raise DatabaseUnavailable(f"the admission ledger {self.where} cannot be opened: {err}") from err
        try:
            yield conn
        except sqlite3.OperationalError as err:  # "database is locked" past the timeout, a disk error
            raise DatabaseUnavailable(f"the admission ledger {self.where}: {err}") from err
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def now(self, conn: Connection) -> float:
        return time.time()


class _PgConnection:
    """A psycopg2 connection that speaks the ledger's ``?`` placeholders: every ``?`` of a statement is one
    (the ledger's SQL has no ``?`` or ``%`` in a literal)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: tuple | list = ()) -> Any:
        cursor = self._conn.cursor()
        cursor.execute(sql.replace("?", "%s"), tuple(params))
        return cursor


class PostgresDb:
    """A PostgreSQL database shared by every host (the cluster profile). Its tables are made on first use;
    the URL names the database, which must exist (``make up-cluster`` makes it)."""

    CONNECT_TIMEOUT_S = 10
    # A client that vanishes mid-decision (power lost, a partition) must not hold the decisions' row lock
    # until TCP gives up (hours): its session ends after a minute idle in its transaction, others wait at
    # most 30 s for a lock and 60 s for a statement (then DatabaseUnavailable: looked at again later), and
    # keepalives find a dead server within a minute.
    SESSION = {
        "options": "-c lock_timeout=30s -c statement_timeout=60s -c idle_in_transaction_session_timeout=60s",
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }

    def __init__(self, url: str, read_only: bool = False) -> None:
        self.url = _libpq_url(url)
        self.where = _without_password(self.url)
        self.read_only = read_only
        with self._connect() as raw:
            conn = _PgConnection(raw)
            newest = ADDED_COLUMNS[-1][0]
            (ready,) = conn.execute(
                "SELECT to_regclass('ledger_lock') IS NOT NULL AND to_regclass(?) IS NOT NULL "
                "AND EXISTS (SELECT 1 FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'admission' AND column_name = ?)",
                (NEWEST_SCHEMA_OBJECT, newest),
            ).fetchone()
            if not ready and read_only:
                (made,) = conn.execute("SELECT to_regclass('admission') IS NOT NULL").fetchone()
                raise LedgerOutdated(self.where) if made else LedgerAbsent(self.where)
            if not ready:  # made once; two hosts starting at once would race on CREATE TABLE: one at a time
                conn.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_KEY,))
                for statement in SCHEMA:
                    conn.execute(statement)
                for column, kind, default in ADDED_COLUMNS:
                    conn.execute(
                        f'ALTER TABLE admission ADD COLUMN IF NOT EXISTS "{column}" {kind} NOT NULL DEFAULT {default}'
                    )
                conn.execute("CREATE TABLE IF NOT EXISTS ledger_lock (id INTEGER PRIMARY KEY)")
                conn.execute("INSERT INTO ledger_lock (id) VALUES (1) ON CONFLICT (id) DO NOTHING")
            raw.commit()

    def _connect(self) -> contextlib.AbstractContextManager[Any]:
        return self.connect(self.url, read_only=self.read_only)

    @classmethod
    @contextlib.contextmanager
    def connect(cls, url: str, read_only: bool = False) -> Iterator[Any]:
        """A psycopg2 connection to ``url``, closed at the end (``read_only``: its transactions may not write);
        DatabaseUnavailable when the server cannot be reached or the connection drops."""
        import psycopg2

        url = _libpq_url(url)
        where = _without_password(url)
        options = str(cls.SESSION["options"]) + (" -c default_transaction_read_only=on" if read_only else "")
        try:
            conn = psycopg2.connect(url, connect_timeout=cls.CONNECT_TIMEOUT_S, **{**cls.SESSION, "options": options})
        except psycopg2.OperationalError as err:
            raise DatabaseUnavailable(f"the shared database at {where} cannot be reached: {err}".strip()) from err
        try:
            yield conn
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as err:  # a restart, a dropped connection
            raise DatabaseUnavailable(f"the shared database at {where}: {err}".strip()) from err
        finally:
            conn.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[_PgConnection]:
        with self._connect() as conn:
            conn.autocommit = True
            yield _PgConnection(conn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_PgConnection]:
        with self._connect() as conn:
            wrapped = _PgConnection(conn)
            try:
                # the decisions' one row lock, held to the commit: decisions from every host, one at a time
                wrapped.execute("SELECT id FROM ledger_lock WHERE id = 1 FOR UPDATE")
                yield wrapped
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def now(self, conn: Connection) -> float:
        return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])


LOCK_KEY = 0x7472_6169  # "trai": the advisory lock that makes the tables once


def _without_password(url: str) -> str:
    """``url`` for messages: its password masked, its query (which may hold one) left out."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc, query=""))


DATABASE_URL_ENV = "TRAINYARD_DATABASE_URL"  # a postgresql:// URL: what every host shares (cluster profile)


def shared_database_url() -> str | None:
    """``$TRAINYARD_DATABASE_URL``: the PostgreSQL database that holds the admission ledger and the sweeps'
    studies when workers run on several hosts; None for the embedded profile (files of this host)."""
    import os

    return os.environ.get(DATABASE_URL_ENV) or None


def sqlalchemy_url(url: str) -> str:
    """``url`` with the psycopg2 driver named, as SQLAlchemy (Optuna's storage) needs it: its default for
    ``postgresql://`` is psycopg 3 from SQLAlchemy 2.1, which is not installed."""
    return "postgresql+psycopg2://" + _libpq_url(url).removeprefix("postgresql://")


POSTGRES_SCHEMES = ("postgresql+psycopg2://", "postgresql://", "postgres://")


def _libpq_url(url: str) -> str:
    """``url`` (any of POSTGRES_SCHEMES) as libpq and psycopg2 take it: ``postgresql://...``."""
    for prefix in POSTGRES_SCHEMES:
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {_without_password(url)}")


@contextlib.contextmanager
def advisory_lock(url: str, name: str) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock ``name`` (any string) while the block runs: one holder at a
    time among every process of every host on that database."""
    import hashlib

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    with PostgresDb.connect(url) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))


def open_db(where: str | Path, read_only: bool = False) -> LedgerDb:
    """The store at ``where``: a ``postgresql://`` URL, or a path of a SQLite file; ``read_only``: opened to
    be read only (its schema as it is: :class:`LedgerOutdated` when an earlier version made it)."""
    text = str(where)
    if text.startswith(POSTGRES_SCHEMES):
        return PostgresDb(text, read_only)
    return SqliteDb(where, read_only)
