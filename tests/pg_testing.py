"""A real PostgreSQL for tests and benches: Debian's `postgresql` binaries, initdb into a fresh folder, the server on
a unix socket in that folder only (no TCP port to collide on), password authentication, stopped and removed at the
end. As root it runs as the `postgres` user (the server refuses root)."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

SUPERUSER = "edgeinspect"


def postgres_bindir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: on PATH, else Debian's /usr/lib/postgresql/<v>/bin."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    """Why no server can be started here (None: one can)."""
    if postgres_bindir() is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' user to run the server as"
    return None


class PostgresServer:
    """One throwaway cluster; `dsn()` for the superuser, `fresh_schema_dsn()` for an empty schema per test."""

    def __init__(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise FileNotFoundError(reason)
        self.bindir = postgres_bindir()
        # Not under pytest's tmp folder: that one is 0700 root, which the postgres user cannot enter.
        self.root = Path(tempfile.mkdtemp(prefix="edgeinspect-pg-"))
        self.data = self.root / "data"
        self.port = 5432  # names the socket file in our own folder; no TCP listener
        self.password = secrets.token_hex(12)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *args: str, timeout: float = 120) -> None:
        proc = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")

    def start(self) -> PostgresServer:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_user:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "-E", "UTF8", "--no-instructions",
        )  # fmt: skip
        pwfile.unlink()
        opts = f"-c listen_addresses='' -k {self.root} -p {self.port} -c max_connections=100 -c fsync=on"
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
            "-o", opts, "start",
        )  # fmt: skip
        self.started = True
        return self

    def dsn(self, **extra: str) -> str:
        parts = {"host": str(self.root), "port": str(self.port), "user": SUPERUSER, "password": self.password,
                 "dbname": "postgres", **extra}  # fmt: skip
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def fresh_schema_dsn(self) -> str:
        """A DSN whose search_path is a new empty schema: a store on it starts from an empty database."""
        import psycopg

        schema = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return self.dsn(options=f"-csearch_path={schema}")

    def stop(self) -> None:
        if self.started:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
