"""The report store's connection to its database: the dialect seam between SQLite and PostgreSQL.

ReportStore writes one set of queries (`?` placeholders, `INSERT ... ON CONFLICT`, partial unique indexes: SQL that
both engines run); a Database runs them on its engine and owns what differs: the connection and its durability
settings, how a write transaction starts, column types in DDL, where the schema version lives, and the error a
unique index raises. SQLite is the embedded default (one gateway, one file); PostgreSQL is the database a gateway
pair shares.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict

from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.services.store.settings import StoreBackend, StoreSettings

log = logging.getLogger(__name__)

# Any constant: every gateway that migrates the same PostgreSQL database takes this advisory lock first.
_MIGRATION_LOCK = 0x6564_6765_7265_7073  # "edgereps"


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


class Database(Protocol):
    """One connection, used under ReportStore's lock; `?` placeholders in every statement."""

    IntegrityError: type[Exception] | tuple[type[Exception], ...]

    def execute(self, sql: str, args: tuple | list = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: list[tuple]) -> None: ...

    def begin(self) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def begin_migration(self) -> None: ...

    def schema_version(self) -> int: ...

    def set_schema_version(self, version: int) -> None: ...

    def has_table(self, name: str) -> bool: ...

    def ddl(self, statement: str) -> str: ...

    def close(self) -> None: ...


class SQLiteDatabase:
    """A file in WAL mode with synchronous=FULL: the WAL is fsynced on every commit, so an acknowledged write
    survives kill -9 and power loss."""

    IntegrityError = sqlite3.IntegrityError

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a claim is one write transaction even
        # against another process on the same file; timeout makes that process wait for the lock instead of failing.
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")

    def execute(self, sql: str, args: tuple | list = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, args)

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        self._conn.executemany(sql, rows)

    def begin(self) -> None:
        # IMMEDIATE takes the write lock up front, so check-then-insert is atomic across processes.
        self._conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        self._conn.execute("ROLLBACK")

    def begin_migration(self) -> None:
        self.begin()  # a second process waits on the write lock, then finds the migration done

    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def set_schema_version(self, version: int) -> None:
        self._conn.execute(f"PRAGMA user_version = {int(version)}")

    def has_table(self, name: str) -> bool:
        row = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def ddl(self, statement: str) -> str:
        return statement

    def close(self) -> None:
        self._conn.close()


@functools.lru_cache(maxsize=256)
def _pg_sql(sql: str) -> str:
    # Our statements have no `?` or `%` inside string literals: `%` (modulo) is escaped for psycopg's
    # format-style parameters, each `?` becomes one.
    return sql.replace("%", "%%").replace("?", "%s")


def dsn_parts(dsn: str) -> dict[str, str]:
    """The DSN's keywords (libpq conninfo or a postgresql:// URL); InvalidInput without echoing its text, which
    holds the password."""
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise InvalidInput(
            "the report database DSN does not parse: give a libpq string ('host=... dbname=... user=...') or a "
            "postgresql://user@host:port/dbname URL"
        ) from None


def redacted(dsn: str) -> str:
    """The DSN for a message or a log line: host, port, database and user, never the password."""
    parts = dsn_parts(dsn)
    keep = ("host", "hostaddr", "port", "dbname", "user")
    return " ".join(f"{k}={parts[k]}" for k in keep if parts.get(k)) or "<libpq defaults>"


class PostgresDatabase:
    """A PostgreSQL database shared by a gateway pair. Autocommit with explicit BEGIN/COMMIT (READ COMMITTED): a
    statement sees rows other gateways committed before it, which is what the claim's "insert or read the winner"
    relies on. Commits are durable with the server's defaults (fsync=on, synchronous_commit=on); a connection lost
    between calls is opened again on the next call."""

    IntegrityError = psycopg.IntegrityError

    def __init__(self, dsn: str, *, connect_timeout_s: int = 10) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self.where = redacted(dsn)
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout_s)
        except psycopg.Error as exc:
            # libpq echoes a malformed conninfo string in its message: strip the password wherever it appears.
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            secret = dsn_parts(self._dsn).get("password")
            if secret:
                text = text.replace(secret, "***")
            raise Unavailable(f"cannot connect to the report database ({self.where}): {text}") from None
        # SUM() over an integer column is NUMERIC in PostgreSQL; our schema has no fractional columns, so
        # NUMERIC comes back as the int it is (as SQLite returns it).
        conn.adapters.register_loader("numeric", _IntNumericLoader)
        return conn

    def _live(self) -> psycopg.Connection:
        if self._conn.closed or self._conn.broken:
            log.warning("report database connection lost; reconnecting to %s", self.where)
            self._conn = self._connect()
        return self._conn

    def execute(self, sql: str, args: tuple | list = ()):
        try:
            return self._live().execute(_pg_sql(sql), tuple(args))
        except psycopg.OperationalError as exc:
            raise Unavailable(f"report database ({self.where}) unreachable: {exc}", retry_after_ms=1000) from exc

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            with self._live().cursor() as cur:
                cur.executemany(_pg_sql(sql), rows)

    def begin(self) -> None:
        self.execute("BEGIN")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        if not (self._conn.closed or self._conn.broken):  # a lost connection has rolled back already
            self._conn.execute("ROLLBACK")

    def begin_migration(self) -> None:
        self.begin()
        # Two gateways starting on an empty database: the second waits here and then finds version N.
        self.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        self.execute("CREATE TABLE IF NOT EXISTS report_schema (version INTEGER NOT NULL)")

    def schema_version(self) -> int:
        row = self.execute("SELECT version FROM report_schema").fetchone()
        return 0 if row is None else row[0]

    def set_schema_version(self, version: int) -> None:
        self.execute("DELETE FROM report_schema")
        self.execute("INSERT INTO report_schema (version) VALUES (?)", (version,))

    def has_table(self, name: str) -> bool:
        # to_regclass follows search_path, as the unqualified names in our statements do.
        return self.execute("SELECT to_regclass(?)", (name,)).fetchone()[0] is not None

    def ddl(self, statement: str) -> str:
        # Epoch microseconds need 64 bits (PostgreSQL's INTEGER is 32); BLOB is BYTEA; SQLite's never-reused
        # AUTOINCREMENT key is a sequence.
        statement = statement.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        return statement.replace("INTEGER", "BIGINT").replace("BLOB", "BYTEA")

    def close(self) -> None:
        self._conn.close()


class Transaction:
    """BEGIN ... COMMIT (ROLLBACK on error); on SQLite BEGIN IMMEDIATE takes the write lock up front."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.begin()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._db.rollback()
        else:
            self._db.commit()


def open_database(cfg: StoreSettings, db_path: Path) -> Database:
    """The gateway's database from its settings: the SQLite file at db_path, or the PostgreSQL server's."""
    if cfg.backend == StoreBackend.sqlite:
        return SQLiteDatabase(db_path)
    try:
        dsn = cfg.read_dsn()
    except OSError as exc:
        raise InvalidInput(f"cannot read store.dsn_file {cfg.dsn_file}: {exc.strerror}") from None
    db = PostgresDatabase(dsn, connect_timeout_s=cfg.connect_timeout_s)
    log.info("report store: PostgreSQL at %s", db.where)
    return db


class _IntNumericLoader(Loader):
    def load(self, data: Any) -> int | float:
        text = bytes(data).decode()
        return int(text) if text.lstrip("-").isdigit() else float(text)
