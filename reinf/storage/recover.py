"""``reinf db recover``: rebuild a damaged SQLite database from every row still readable.

The damaged file is kept beside the new one (``<name>.damaged-<timestamp>``); a readable
rating whose turn was lost keeps a placeholder turn, so no readable rating is dropped. A
pair (a preference between two replies) whose turns or conversation were lost is dropped
instead: a placeholder reply would teach a preference for or against a text nobody wrote.
So is a rewrite whose turn was lost (it has no prompt left to answer).
Checking a database and explaining its faults stay in ``reinf.db``.
"""
from __future__ import annotations

import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from reinf.errors import StoreError
from reinf.storage.db import create_db_engine, upgrade

# --- recovery: copy what can still be read ------------------------------------------------

# Parents before children, so foreign keys hold as rows go in.
RECOVER_TABLES = ("conversations", "turns", "ratings", "rewrites", "pairs", "training_runs",
                  "checkpoints")
BATCH = 256
LOST_TITLE = "(recovered: turns that could not be read back)"
LOST_REPLY = "[this turn could not be read back when the database was recovered]"


def recover(path: Path, *, now: datetime | None = None) -> dict:
    """Rebuild the SQLite database at ``path`` from every row that can still be read.

    The damaged file (with its write-ahead log) is renamed ``<name>.damaged-<timestamp>``
    and kept; a new database with the current schema takes its place. Rows are read
    table by table in rowid order; a damaged page or row is stepped over, never the rest of
    the table. A readable rating whose turn was lost keeps a placeholder turn (and a
    placeholder conversation), so no readable rating is dropped; a pair that names a lost
    turn or conversation is dropped (counted in its table's ``dropped``). Returns a report:
    ``{"path", "damaged_copy", "tables": {name: {"rows", "skipped", ...}}, "placeholders",
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
            dropped = _drop_orphan_pairs(dst)  # before placeholders stand in for lost turns
            # a rewrite whose turn was lost has no prompt left to answer: it goes too
            lost = dst.execute("DELETE FROM rewrites WHERE turn_id NOT IN "
                               "(SELECT id FROM turns)").rowcount
            placeholders = _add_placeholders(dst)
            dropped += _drop_orphan_pairs(dst)  # a lost conversation without turns
            tables["pairs"]["rows"] -= dropped
            tables["pairs"]["dropped"] = dropped
            tables["rewrites"]["rows"] -= lost
            tables["rewrites"]["dropped"] = lost
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
        return {"rows": 0, "skipped": 0, "readable": _absent(src, table)}
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


def _absent(src: sqlite3.Connection, table: str) -> bool:
    """Whether the schema is readable and has no ``table``: a database from before the
    revision that added it (``pairs`` came with 0004, ``rewrites`` with 0005), where
    nothing was lost."""
    try:
        return src.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                           (table,)).fetchone() is None
    except sqlite3.DatabaseError:
        return False


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


def _drop_orphan_pairs(dst: sqlite3.Connection) -> int:
    """Delete the pairs that name a turn or conversation that is not there; how many."""
    return dst.execute(
        "DELETE FROM pairs WHERE "
        + " OR ".join(f"({column} IS NOT NULL AND {column} NOT IN (SELECT id FROM {table}))"
                      for column, table in (("a_turn_id", "turns"), ("b_turn_id", "turns"),
                                            ("prompt_turn_id", "turns"),
                                            ("conversation_id", "conversations")))).rowcount


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
