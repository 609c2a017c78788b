"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` in a temporary directory.

The server listens only on a Unix socket inside that directory (no TCP port), trusts local
connections, and skips durability (fsync off): it lives for one test session. PostgreSQL
refuses to run as root, so under root (CI) the cluster belongs to an unprivileged user
(Debian's ``postgres`` when the package created it, else ``nobody``).

Debian keeps the binaries in /usr/lib/postgresql/<version>/bin, off PATH; ``find_pg_bin``
looks there too. ``REINF_TEST_PG_BIN`` names the directory explicitly; set it to ``off`` to
hide the server (the PostgreSQL tests then skip).
"""
from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROLE = "reinf"
DATABASE = "reinf_test"
PORT = 5432  # only names the socket file: the server opens no TCP port


def find_pg_bin(environ=os.environ) -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, newest version first; None if absent."""
    forced = environ.get("REINF_TEST_PG_BIN", "")
    if forced:
        return None if forced == "off" else _usable(Path(forced))
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).parent] if on_path else []
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
                         key=_version, reverse=True)
    return next((c for c in candidates if _usable(c)), None)


def _version(bindir: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin: 15 sorts after 9.6, as text it would not."""
    return tuple(int(n) for n in re.findall(r"\d+", bindir.parent.name))


def _usable(path: Path) -> Path | None:
    ok = all(os.access(path / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))
    return path if ok else None


def missing_reason(environ=os.environ) -> str | None:
    """Why the PostgreSQL tests cannot run here, or None when they can."""
    forced = environ.get("REINF_TEST_PG_BIN", "")
    if forced == "off":
        return "the PostgreSQL server (initdb, pg_ctl) is hidden by REINF_TEST_PG_BIN=off"
    if find_pg_bin(environ) is None:
        where = forced or "PATH or /usr/lib/postgresql/*/bin"
        return (f"no PostgreSQL server (initdb, pg_ctl, postgres) in {where}: install "
                "Debian's `postgresql` package (.ci/run does) or point REINF_TEST_PG_BIN at "
                "the directory that holds them")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver is missing: pip install -e '.[postgres]' (psycopg 3)"
    return None


class PgServer:
    """One running cluster with one database; ``create_schema()`` gives each test an empty
    schema of its own, and ``url(schema)`` the URL that works in it."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        # /tmp: a short path (a Unix socket path has ~100 characters at most) that the
        # unprivileged owner can reach even when $TMPDIR is private to root.
        self.dir = Path(tempfile.mkdtemp(prefix="reinf-pg-",
                                         dir="/tmp" if os.path.isdir("/tmp") else None))
        self.data = self.dir / "data"
        self._names = itertools.count(1)
        self._as = {}
        if os.geteuid() == 0:  # postgres will not run as root
            user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            if user is None:
                raise RuntimeError("running as root and no unprivileged user (postgres, "
                                   "nobody) to own the test cluster")
            pw = pwd.getpwnam(user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def _run(self, *args: str) -> None:
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        proc = subprocess.run([str(self.bindir / args[0]), *args[1:]], env=env, cwd=self.dir,
                              capture_output=True, text=True, timeout=120, **self._as)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}):\n"
                               f"{proc.stdout}{proc.stderr}")

    def start(self) -> "PgServer":
        self._run("initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--no-instructions")
        opts = (f"-c listen_addresses='' -c unix_socket_directories='{self.dir}' -p {PORT} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=50")
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                  "-l", str(self.dir / "server.log"), "-o", opts)
        self._admin(f"CREATE DATABASE {DATABASE} ENCODING 'UTF8' TEMPLATE template0",
                    dbname="postgres")
        return self

    def url(self, schema: str | None = None) -> str:
        """A URL for the test database; with ``schema``, every connection works in it only."""
        url = f"postgresql+psycopg://{ROLE}@/{DATABASE}?host={self.dir}&port={PORT}"
        return url + (f"&options=-csearch_path%3D{schema}" if schema else "")

    def _admin(self, sql: str, dbname: str = DATABASE) -> None:
        import psycopg

        with psycopg.connect(host=str(self.dir), port=PORT, user=ROLE, dbname=dbname,
                             autocommit=True) as conn:
            conn.execute("SET lock_timeout = '20s'")  # a leaked connection fails, never hangs
            conn.execute(sql)

    def create_schema(self) -> str:
        """A fresh, empty schema: a new database per test would cost ~0.5 s (CREATE
        DATABASE copies a template), a schema a few ms."""
        name = f"reinf_test_{next(self._names)}"
        self._admin(f"CREATE SCHEMA {name}")
        return name

    def drop_schema(self, name: str) -> None:
        self._admin(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
