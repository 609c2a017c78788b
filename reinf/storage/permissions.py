"""Who may read Reinf's data: the person who runs it, and no one else.

The data directory holds every conversation, rating and adapter, so it is 700 and what
Reinf writes in it is 600 (directories 700). New files get that from the umask the CLI
sets when it starts (``use_private_umask``; the trainer child and the log handler inherit
it), or from an explicit mode where a file may be made outside the CLI or outside the data
directory: the SQLite database (SQLite gives its -wal and -shm files the database's mode)
and ``reinf export -o`` files. A data directory an older Reinf made 755 with 644 files is
tightened when the CLI starts and when the store opens (``secure_data_dir``), with one line
on stderr. POSIX only: on Windows, the profile directory's ACLs already keep others out.
"""
from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PRIVATE_UMASK = 0o077
POSIX = os.name == "posix"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def use_private_umask() -> int | None:
    """Make what this process (and its children) creates 600/700; returns the old umask
    (None off POSIX) for ``restore_umask``."""
    return os.umask(PRIVATE_UMASK) if POSIX else None


def restore_umask(previous: int | None) -> None:
    if POSIX and previous is not None:
        os.umask(previous)


def open_private(path: str | Path) -> TextIO:
    """``path`` opened for writing (truncated) as UTF-8 text, 600 even if it existed with a
    wider mode. A device or FIFO (``/dev/stdout``) keeps its mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        if POSIX and stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def create_private_file(path: Path) -> None:
    """Create ``path`` empty and 600 unless it exists (for SQLite, an empty file is a new
    database; made here, SQLite never creates it with the umask's 644)."""
    if not POSIX or path.exists():
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:  # another process made it first: the tightening handles it
        pass


def sqlite_file(db_url: str) -> Path | None:
    """The file of a SQLite ``db_url``; None for other servers and in-memory databases."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(db_url)
    except ArgumentError:
        return None  # db.create_db_engine says what is wrong with it
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser()


def secure_data_dir(config, stream: TextIO | None = None) -> list[Path]:
    """Tighten the data directory and the database files (see ``tighten``), saying so on
    ``stream`` (stderr) in one line. Returns the paths changed."""
    data_dir = Path(config.data_dir)
    changed = tighten(data_dir, sqlite_file(config.db_url))
    if changed:
        notice = describe(data_dir, changed)
        log.info(notice)  # the log file; the terminal gets it once, below
        print(notice, file=stream or sys.stderr, flush=True)
    return changed


def tighten(data_dir: Path, db_file: Path | None = None) -> list[Path]:
    """chmod what other users may reach: the data directory (700; not the home directory
    itself); its logs/ and checkpoints/ trees (directories 700, files 600); the database
    with its -wal, -shm and -journal files (600). Symbolic links inside are not followed;
    a path this user does not own is left as it is. Returns the paths changed."""
    if not POSIX or not data_dir.is_dir():
        return []
    if not data_dir.stat().st_mode & stat.S_IWUSR:
        # Read-only on purpose: every command stops with one line naming it (db.py), and
        # the run after the person's `chmod u+rwx` tightens it. Never widen it here.
        return []
    # REINF_HOME=$HOME would make the home directory 700: that is the person's call
    paths = [] if data_dir.resolve() == Path.home().resolve() else [data_dir]
    for name in ("logs", "checkpoints"):
        paths += _tree(data_dir / name)
    if db_file is not None:
        paths += [db_file.with_name(db_file.name + s) for s in ("", *SQLITE_SIDE_FILES)]
    return [p for p in paths if _make_private(p, follow=p == data_dir)]


def _tree(root: Path) -> list[Path]:
    if not root.is_dir() or root.is_symlink():
        return []
    found = [root]
    for top, dirs, files in os.walk(root):  # does not descend into linked directories
        found += [Path(top) / name for name in (*dirs, *files)]
    return found


def _make_private(path: Path, *, follow: bool) -> bool:
    """Take every group and other bit off ``path`` if it has any (755 -> 700, 644 -> 600);
    the owner's own bits stay as they are."""
    try:
        st = path.stat() if follow else path.lstat()
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
            return False
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except FileNotFoundError:
        return False
    except OSError as exc:  # not ours (a shared directory): say so in the log, carry on
        log.info("could not tighten the permissions of %s: %s", path, exc.strerror or exc)
        return False
    return True


def describe(data_dir: Path, changed: list[Path]) -> str:
    """The one-line notice for ``changed`` (see ``tighten``)."""
    inside = [p for p in changed if p != data_dir]
    parts = [f"{data_dir} to 700"] if data_dir in changed else []
    if inside:
        parts.append(f"{len(inside)} {'path' if len(inside) == 1 else 'paths'} "
                     f"{'in it' if parts else 'in ' + str(data_dir)} to 700/600")
    return (f"tightened permissions of {' and of '.join(parts)} "
            f"({'it was' if not inside else 'they were'} readable by other users)")
