"""Database connections and migrations.

SQLite runs with WAL (readers never block the writer), a busy timeout (writers
queue instead of failing), foreign keys, and secure_delete (forgotten text is
overwritten, not left in free pages). Write transactions start with
``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a read lock to a
write lock, which is where "database is locked" errors come from.

Migrations live in the top-level ``migrations/`` package and are applied with
Alembic at start-up and by ``reinf db upgrade``. A failure is raised, never
swallowed.

Before migrations, a SQLite file is checked (``check_database``): its directory must be
writable and ``PRAGMA quick_check`` must pass (about 25 ms on a 40 MB, 10,000-turn
database, warm cache). A damaged file, a lock held by another program or a read-only
directory is then a one-line StoreError with its fix, instead of a traceback, or a 500 on
the first query that reads a bad page. ``recover`` copies every row SQLite can still read
out of a damaged file (``reinf db recover``).
"""
from __future__ import annotations

import logging
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from reinf.errors import StoreError

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
        check_access(Path(parsed.database).expanduser())
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
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA secure_delete=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


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
        directory.mkdir(parents=True, exist_ok=True)
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


# --- recovery: copy what can still be read ------------------------------------------------

# Parents before children, so foreign keys hold as rows go in.
RECOVER_TABLES = ("conversations", "turns", "ratings", "training_runs", "checkpoints")
BATCH = 256
LOST_TITLE = "(recovered: turns that could not be read back)"
LOST_REPLY = "[this turn could not be read back when the database was recovered]"


def recover(path: Path, *, now: datetime | None = None) -> dict:
    """Rebuild the SQLite database at ``path`` from every row that can still be read.

    The damaged file (with its write-ahead log) is renamed ``<name>.damaged-<timestamp>``
    and kept; a new database with the current schema takes its place. Rows are read
    table by table in rowid order; a damaged page or row is stepped over, never the rest of
    the table. A readable rating whose turn was lost keeps a placeholder turn (and a
    placeholder conversation), so no readable rating is dropped. Returns a report:
    ``{"path", "damaged_copy", "tables": {name: {"rows", "skipped"}}, "placeholders",
    "integrity"}``. The caller makes sure no other process uses the database.
    """
    path = Path(path)
    if not path.exists():
        raise StoreError(f"there is no database at {path}", fix="run `reinf init`")
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    kept, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while kept.exists():  # never replace an earlier damaged copy
        kept, n = path.with_name(f"{path.name}.damaged-{stamp}-{n}"), n + 1
    building = path.with_name(f"{path.name}.recovering-{stamp}")
    for suffix in ("", "-wal", "-shm"):  # a recovery killed part-way
        Path(f"{building}{suffix}").unlink(missing_ok=True)
    # Built beside the damaged file, which is only read (its WAL too) until the swap: a
    # kill before the swap leaves everything as it was.
    try:
        report = _copy_readable(path, building)
    except BaseException:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        raise
    # The damaged file keeps its WAL: SQLite finds "<name>-wal" beside "<name>".
    os.rename(path, kept)
    for suffix in ("-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.rename(f"{path}{suffix}", f"{kept}{suffix}")
    os.rename(building, path)
    report.update(path=str(path), damaged_copy=str(kept))
    return report


def _copy_readable(source: Path, target: Path) -> dict:
    src, repaired = _open_damaged(source)
    try:
        dst_engine = create_db_engine(f"sqlite:///{target}")
        try:
            upgrade(dst_engine)  # the current schema, through the same migrations
        finally:
            dst_engine.dispose()
        dst = sqlite3.connect(target, isolation_level=None)
        try:
            dst.execute("PRAGMA foreign_keys=OFF")  # placeholders are added before the end
            dst.execute("BEGIN IMMEDIATE")
            tables = {}
            for table in RECOVER_TABLES:
                tables[table] = _copy_table(src, dst, table)
            placeholders = _add_placeholders(dst)
            dst.execute("COMMIT")
            problems = dst.execute("PRAGMA foreign_key_check").fetchall()
            integrity = dst.execute("PRAGMA integrity_check").fetchone()[0]
            if problems:
                integrity += f"; {len(problems)} rows refer to missing rows"
            dst.execute("PRAGMA journal_mode=DELETE")  # one file, renamed into place
        finally:
            dst.close()
    finally:
        src.close()
        if repaired is not None:
            repaired.unlink(missing_ok=True)
    return {"tables": tables, "placeholders": placeholders, "integrity": integrity}


def _open_damaged(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """A read-only connection to the damaged file (it is never written), and the temporary
    copy it reads instead, if any: a file whose first 100 bytes (the header) are gone is
    read through a copy with a rebuilt header."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    # Read the pages that are there even when the header counts more (a truncated file);
    # on a read-only connection this changes nothing on disk.
    conn.execute("PRAGMA writable_schema=ON")
    try:
        conn.execute("SELECT name FROM sqlite_master").fetchall()
        return conn, None
    except sqlite3.DatabaseError as exc:
        conn.close()
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_NOTADB" \
                and "not a database" not in str(exc):
            raise StoreError(f"nothing in {path} can be read: {exc}",
                             fix="restore the database from a backup") from None
    repaired = path.with_name(path.name + "-header")
    data = bytearray(path.read_bytes())
    for page_size in (4096, 1024, 2048, 8192, 16384, 32768, 65536):
        if len(data) < page_size or len(data) % page_size:
            continue
        data[:100] = _header(page_size, len(data) // page_size)
        repaired.write_bytes(data)
        conn = sqlite3.connect(f"file:{repaired}?mode=ro&immutable=1", uri=True,
                               isolation_level=None)
        conn.execute("PRAGMA writable_schema=ON")
        try:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                return conn, repaired
        except sqlite3.DatabaseError:
            pass
        conn.close()
    repaired.unlink(missing_ok=True)
    raise StoreError(f"nothing in {path} can be read: its header is not a SQLite header and "
                     "could not be rebuilt", fix="restore the database from a backup")


def _header(page_size: int, pages: int) -> bytes:
    """A plain SQLite header (https://sqlite.org/fileformat.html#the_database_header):
    UTF-8, schema format 4, no freelist, rollback journal, ``pages`` pages."""
    h = bytearray(100)
    h[0:16] = b"SQLite format 3\x00"
    h[16:18] = (1 if page_size == 65536 else page_size).to_bytes(2, "big")
    h[18], h[19], h[20], h[21], h[22], h[23] = 1, 1, 0, 64, 32, 32
    h[24:28] = (1).to_bytes(4, "big")        # change counter
    h[28:32] = pages.to_bytes(4, "big")      # valid: counter == version-valid-for
    h[40:44] = (1).to_bytes(4, "big")        # schema cookie
    h[44:48] = (4).to_bytes(4, "big")        # schema format
    h[56:60] = (1).to_bytes(4, "big")        # UTF-8
    h[92:96] = (1).to_bytes(4, "big")
    major, minor, patch = sqlite3.sqlite_version_info
    h[96:100] = (major * 1_000_000 + minor * 1_000 + patch).to_bytes(4, "big")
    return bytes(h)


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> dict:
    """Copy the readable rows of ``table``; returns {"rows": copied, "skipped": known lost}."""
    try:
        have = [r[1] for r in src.execute(f'PRAGMA table_info("{table}")').fetchall()]
    except sqlite3.DatabaseError:
        have = []
    want = [r[1] for r in dst.execute(f'PRAGMA table_info("{table}")').fetchall()]
    columns = [c for c in want if c in have]
    if not columns:
        return {"rows": 0, "skipped": 0, "readable": False}
    names = ", ".join(f'"{c}"' for c in columns)
    insert = (f'INSERT OR IGNORE INTO "{table}" ({names}) '
              f'VALUES ({", ".join("?" for _ in columns)})')
    copied = skipped = 0
    for ok, row in _readable_rows(src, table, names):
        if not ok:
            skipped += 1
            continue
        copied += dst.execute(insert, row).rowcount
    return {"rows": copied, "skipped": skipped, "readable": True}


def _readable_rows(conn: sqlite3.Connection, table: str, names: str):
    """(True, row) for every row that reads back, (False, None) for one that does not, in
    rowid order. A damaged page in the way is stepped over: the next key that a seek can
    reach is found by doubling steps, then bisection."""
    last = -(2 ** 63)
    top = 2 ** 63 - 1
    page = f'SELECT rowid, {names} FROM "{table}" WHERE rowid > ? ORDER BY rowid LIMIT {BATCH}'
    while True:
        try:
            rows = conn.execute(page, (last,)).fetchall()
        except sqlite3.DatabaseError:
            rows = None
        if rows is not None:
            for row in rows:
                yield True, row[1:]
            if len(rows) < BATCH:
                return
            last = rows[-1][0]
            continue
        # Row by row until the damage is passed.
        rowid = _next_rowid(conn, table, last)
        if rowid is None:  # the seek itself fails: find where it works again
            failing, step = last, 1
            while True:
                probe = min(last + step, top)
                if _next_rowid(conn, table, probe) is not None or probe == top:
                    break
                failing, step = probe, step * 2
            lo, hi = failing, probe  # seeking from lo fails, from hi works (or the end)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _next_rowid(conn, table, mid) is not None:
                    hi = mid
                else:
                    lo = mid
            if hi == top and _next_rowid(conn, table, hi) is None:
                return
            last = hi
            continue
        if rowid is False:  # no rows after ``last``
            return
        try:
            row = conn.execute(f'SELECT {names} FROM "{table}" WHERE rowid = ?',
                               (rowid,)).fetchone()
            yield True, row
        except sqlite3.DatabaseError:
            yield False, None
        last = rowid


def _next_rowid(conn: sqlite3.Connection, table: str, after: int):
    """The first rowid after ``after``; False when there is none; None when the seek fails."""
    try:
        row = conn.execute(f'SELECT rowid FROM "{table}" WHERE rowid > ? ORDER BY rowid '
                           'LIMIT 1', (after,)).fetchone()
    except sqlite3.DatabaseError:
        return None
    return False if row is None else row[0]


def _add_placeholders(dst: sqlite3.Connection) -> dict:
    """Rows whose parent was lost get a placeholder parent, so that nothing readable (a
    rating above all) is dropped and the foreign keys hold."""
    now = datetime.now(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")
    conversations = dst.execute(
        "INSERT INTO conversations (id, created_at, updated_at, title, user_id) "
        "SELECT DISTINCT conversation_id, ?, ?, ?, 'local' FROM turns WHERE conversation_id "
        "NOT IN (SELECT id FROM conversations)", (now, now, LOST_TITLE)).rowcount
    lost = [r[0] for r in dst.execute(
        "SELECT turn_id FROM ratings WHERE turn_id NOT IN (SELECT id FROM turns)")]
    if lost:
        conv = dst.execute("INSERT INTO conversations (created_at, updated_at, title, user_id) "
                           "VALUES (?, ?, ?, 'local')", (now, now, LOST_TITLE)).lastrowid
        conversations += 1
        dst.executemany(
            'INSERT INTO turns (id, conversation_id, "index", user_message, reply, model, '
            "gen_params, created_at, interrupted, context_forgotten) "
            "VALUES (?, ?, ?, '', ?, '', '{}', ?, 0, 1)",
            [(turn_id, conv, turn_id, LOST_REPLY, now) for turn_id in lost])
    return {"conversations": conversations, "turns": len(lost)}
