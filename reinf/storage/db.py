"""Database connections and migrations.

SQLite runs with WAL (readers never block the writer), a busy timeout (writers
queue instead of failing), foreign keys, and secure_delete (forgotten text is
overwritten, not left in free pages). Write transactions start with
``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a read lock to a
write lock, which is where "database is locked" errors come from. Switching a new file
to WAL is the one step SQLite does not queue (it answers "locked" at once while another
process holds the file's write lock, as when the server, the trainer and a CLI command
first open a new database together), so ``enter_wal`` retries it within the busy timeout.

Migrations live in the top-level ``migrations/`` package and are applied with
Alembic at start-up and by ``reinf db upgrade``. A failure is raised, never
swallowed.

Before migrations, a SQLite file is checked (``check_database``): its directory must be
writable and ``PRAGMA quick_check`` must pass (about 25 ms on a 40 MB, 10,000-turn
database, warm cache). A damaged file, a lock held by another program or a read-only
directory is then a one-line StoreError with its fix, instead of a traceback, or a 500 on
the first query that reads a bad page. ``reinf.storage.recover`` copies every row SQLite can still
read out of a damaged file (``reinf db recover``).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from reinf.errors import StoreError
from reinf.storage.permissions import PRIVATE_DIR, create_private_file

log = logging.getLogger(__name__)


def migrations_dir() -> Path:
    import migrations  # the top-level package shipped in the wheel

    return Path(migrations.__file__).resolve().parent


def create_db_engine(url: str, busy_timeout_ms: int = 15_000) -> Engine:
    """An Engine for ``url`` with Reinf's SQLite settings applied to every connection."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"db_url {url!r} is not a database URL",
                         fix="use e.g. sqlite:////home/me/.reinf/reinf.db") from None
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(url, pool_pre_ping=True)
        except (ImportError, SQLAlchemyError) as exc:
            raise StoreError(f"cannot use db_url {url!r}: {exc}",
                             fix="install the database driver, or use SQLite") from None
    memory = parsed.database in (None, "", ":memory:")
    if not memory:
        path = Path(parsed.database).expanduser()
        check_access(path)
        create_private_file(path)  # 600 from the start: it holds every conversation
    engine = create_engine(
        url,
        connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
        **({"poolclass": StaticPool} if memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let us issue BEGIN ourselves (pysqlite's own BEGIN is always DEFERRED).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        if not memory:
            enter_wal(cur, busy_timeout_ms / 1000)
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA secure_delete=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def enter_wal(cur, wait_s: float) -> None:
    """``PRAGMA journal_mode=WAL``, tried again for up to ``wait_s`` seconds while another
    connection holds the write lock: on a file not yet in WAL, SQLite answers SQLITE_BUSY
    at once instead of calling the busy handler. After ``wait_s`` the error goes up (and
    ``explain`` turns it into the one-line "locked by another process")."""
    deadline = time.monotonic() + wait_s
    pause = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorname", "").startswith("SQLITE_BUSY") \
                or "locked" in str(exc).lower()
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _alembic_config(engine: Engine):
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser treats "%" as interpolation; URL-escaped parts (a socket path in
    # ?host=%2F..., a password) carry it, so double it.
    cfg.set_main_option("sqlalchemy.url",
                        engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision``. Raises StoreError with the cause on failure."""
    from alembic import command

    try:
        command.upgrade(_alembic_config(engine), revision)
    except Exception as exc:  # noqa: BLE001 - re-raised with context, never swallowed
        # The traceback goes to the log file (and the terminal with --debug); the person
        # gets one line.
        log.info("migration failed", exc_info=True)
        known = explain(exc, sqlite_path(engine))
        if known is not None:
            raise known from exc
        cause = getattr(exc, "orig", None) or exc
        first = (str(cause).strip().splitlines() or [""])[0]
        raise StoreError(f"database migration to {revision} failed: "
                         f"{type(cause).__name__}: {first}",
                         fix="restore the DB from a backup or fix the cause, then run "
                             "`reinf db upgrade`; start-up is stopped so no data is lost",
                         status=503) from exc


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    command.downgrade(_alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from alembic.config import Config as AlembicConfig
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(cfg).get_current_head()


def require_schema(engine: Engine) -> None:
    """The database holds Reinf's tables at this version's revision, or a StoreError says
    which command fixes it. Nothing is created or migrated here (read-only commands)."""
    where = engine.url.render_as_string(hide_password=True)
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    if current is None:
        others = table_names(engine)
        if others:
            raise StoreError(f"the database {where} holds {len(others)} tables but not "
                             "Reinf's: db_url points at another application's database",
                             fix="point REINF_DB_URL (or db_url in config.yaml) at Reinf's "
                                 "own database", status=503)
        raise StoreError(f"the database {where} has no Reinf tables yet",
                         fix="run `reinf init` to create them", status=503)
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from alembic.config import Config as AlembicConfig
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    try:
        known = ScriptDirectory.from_config(cfg).get_revision(current) is not None
    except CommandError:
        known = False
    if not known:
        raise StoreError(f"the database {where} is at schema revision {current}, which this "
                         f"Reinf does not know (a newer Reinf wrote it)",
                         fix="upgrade Reinf, or point db_url at another database", status=503)
    raise StoreError(f"the database {where} has an older schema ({current}; this Reinf "
                     f"needs {head})",
                     fix="run `reinf db upgrade` (`reinf serve` upgrades it too)", status=503)


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())


# --- start-up checks: damaged, locked, read-only (SQLite) ----------------------------------

class DamagedDatabase(StoreError):
    """The SQLite file is damaged: restore a backup or ``reinf db recover``."""


class LockedDatabase(StoreError):
    """Another program holds the database's lock (e.g. ``locking_mode=EXCLUSIVE``)."""


class ReadOnlyData(StoreError):
    """Reinf may not write where it keeps its state."""


RESTORE_FIX = ("restore it from a backup, or run `reinf db recover` to copy every readable row "
               "into a new database (the damaged file is kept beside it)")


def sqlite_path(engine: Engine) -> Path | None:
    """The file of a SQLite engine; None for other servers and in-memory databases."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    return Path(engine.url.database).expanduser()


def check_access(path: Path) -> None:
    """The database's directory exists (it is created if not) and Reinf may write there:
    SQLite keeps the database, its write-ahead log and its shared-memory index in it."""
    check_directory(path.parent)
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ReadOnlyData(f"the database file {path} is read-only", status=503,
                           fix=f"make it writable (`chmod u+rw {path}`; check its owner with "
                               f"`ls -l {path}`)")


def check_directory(directory: Path) -> None:
    """``directory`` exists (it is created if not) and this process may write in it."""
    try:
        directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise ReadOnlyData(f"cannot create the data directory {directory}: "
                           f"{exc.strerror or exc}", status=503,
                           fix=f"create it, or make {_first_existing(directory)} writable, or "
                               "set REINF_HOME to a writable directory") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise read_only(directory)


def read_only(directory: Path) -> StoreError:
    return ReadOnlyData(f"the data directory {directory} is read-only: Reinf keeps its "
                        "database, lock and log files there", status=503,
                        fix=f"make it writable (`chmod u+rwx {directory}`; check its owner "
                            f"with `ls -ld {directory}`), or set REINF_HOME to a writable "
                            "directory")


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_database(engine: Engine) -> None:
    """A SQLite file that is there must be sound: ``PRAGMA quick_check`` (its b-trees and
    pages, not the indexes' contents) must say "ok". A new, empty file passes at once."""
    path = sqlite_path(engine)
    if path is None or not path.exists():
        return
    try:
        with engine.connect() as conn:
            answer = [row[0] for row in conn.exec_driver_sql("PRAGMA quick_check").fetchall()]
    except DBAPIError as exc:
        known = explain(exc, path)
        if known is None:
            raise StoreError(f"cannot open the database {path}: {_first_line(exc)}",
                             status=503, fix="check the disk and the file") from None
        raise known from None
    if answer != ["ok"]:
        raise damaged(path, f"{answer[0]}" + (f", and {len(answer) - 1} more problems"
                                              if len(answer) > 1 else ""))


def damaged(path: Path, detail: str) -> StoreError:
    return DamagedDatabase(f"the database {path} is damaged ({detail}); Reinf stopped before "
                           "any migration or write", fix=RESTORE_FIX, status=503)


def explain(exc: BaseException, path: Path | None) -> StoreError | None:
    """What a SQLite error means for the person (damaged, locked, read-only), or None."""
    cause = getattr(exc, "orig", None) or exc
    if not isinstance(cause, sqlite3.Error) or path is None:
        return None
    name = getattr(cause, "sqlite_errorname", "") or ""
    text = str(cause).lower()
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text \
            or "not a database" in text:
        return damaged(path, str(cause))
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        holders = lock_holders(path)
        who = ", ".join(f"pid {pid}" + (f" ({prog})" if prog else "") for pid, prog in holders)
        return LockedDatabase(f"the database {path} is locked by another process"
                              + (f": {who}" if who else ""), status=503,
                              fix="close that program, or wait for it to finish, then try "
                                  "again")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) or "readonly" in text:
        if not os.access(path.parent, os.W_OK | os.X_OK):
            return read_only(path.parent)
        return ReadOnlyData(f"cannot write the database {path}: {cause}", status=503,
                            fix=f"make it and {path.parent} writable (check owner and "
                                "permissions), or set REINF_HOME to a writable directory")
    return None


def lock_holders(path: Path) -> list[tuple[int, str]]:
    """Other processes holding a write lock on ``path`` (Linux: /proc/locks), with their
    program names; [] where that cannot be known."""
    try:
        st = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in lines:
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 fd:00:5678 0 EOF" (a "->" marks a waiter)
        if "->" in parts or len(parts) < 6:
            continue
        kind, pid, where = parts[3], parts[4], parts[5]
        if kind == "WRITE" and where == key and pid.isdigit() and int(pid) != os.getpid() \
                and int(pid) not in pids:
            pids.append(int(pid))
    out = []
    for pid in pids:
        try:
            prog = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            prog = ""
        out.append((pid, prog))
    return out


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]
