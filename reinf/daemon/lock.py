"""Lock files in the data directory: one ``reinf serve`` per data directory, one training
round at a time.

``<data_dir>/reinf.pid`` is held with ``fcntl.flock`` by the serving process for its whole
life and holds JSON ``{pid, url, host, port, started_at, version}``. The kernel drops a
flock when its process dies, however it dies (``kill -9`` included), so a file whose lock
nobody holds is stale by definition and is taken over; nothing ever has to guess from a
pid whether the owner still lives. The file is never deleted, only emptied on release:
deleting it would let two processes lock two different files under the same name.

People delete it all the same (``rm reinf.pid``, a habit after a crash), so the server also
holds a flock on the data directory itself, which cannot be deleted from under it while
its database and logs are in it: a second ``reinf serve`` is refused even then.

``<data_dir>/train.lock`` is held around each training round. The daemon hands its
descriptor to the child trainer, so a trainer that outlives a crashed daemon (no
parent-death signal on macOS) still holds it and no second round starts beside it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reinf.errors import Conflict, ReinfError, StoreError

LOCK_NAME = "reinf.pid"
TRAIN_LOCK_NAME = "train.lock"
# A probe (``reinf status``) holds the lock for microseconds; a starting server retries
# for this long before it believes another server holds it (and the daemon's trainer
# before it believes another round holds the train lock).
RETRY_SECONDS = 0.5
RETRY_INTERVAL = 0.05


def lock_path(config) -> Path:
    return config.data_dir / LOCK_NAME


def train_lock_path(config) -> Path:
    return config.data_dir / TRAIN_LOCK_NAME


def get_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("reinf")
    except metadata.PackageNotFoundError:
        return "unknown"


class FileLock:
    """An exclusive flock on a file that also carries a small JSON description."""

    def __init__(self, path: Path, fd: int, info: dict[str, Any]):
        self.path = path
        self.fd: int | None = fd
        self.info = info
        self.dir_fd: int | None = None  # the server's lock on the data directory

    @property
    def held(self) -> bool:
        return self.fd is not None

    def update(self, **info: Any) -> None:
        """Rewrite the JSON (e.g. the URL, once the server has bound its port)."""
        if self.fd is None:
            raise RuntimeError(f"{self.path} is not locked by this process")
        if isinstance(info.get("port"), str) and info["port"].isdigit():
            info["port"] = int(info["port"])  # waitress reports the bound port as text
        self.info.update(info)
        data = json.dumps(self.info, sort_keys=True).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)

    def release(self) -> None:
        """Empty the file and drop the lock (idempotent)."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            if self.dir_fd is not None:
                dir_fd, self.dir_fd = self.dir_fd, None
                os.close(dir_fd)  # closing the last descriptor drops its flock

    def __enter__(self) -> "FileLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


Lock = FileLock


def try_lock(path: Path, info: dict[str, Any]) -> FileLock | None:
    """Lock ``path`` (created if missing) and write ``info`` into it; None if it is held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_CLOEXEC (Python's default): no child inherits the lock by accident.
    fd = _flock_exclusive(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    if fd is None:
        return None
    lock = FileLock(path, fd, {})
    try:
        lock.update(**info)
    except OSError as exc:
        # The flock is taken but its description cannot be written (a full disk): drop the
        # lock again, or every later round would find it held until this process ends.
        lock.release()
        raise lock_write_error(path, exc) from None
    return lock


def lock_write_error(path: Path, exc: OSError) -> ReinfError:
    """One line for a lock file that cannot be written."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return StoreError(f"no space left on device in {path.parent}",
                          fix="free some space, then try again")
    return StoreError(f"cannot write {path}: {exc.strerror or exc}",
                      fix=f"check the disk and the permissions of {path.parent}")


def read_info(path: Path) -> dict[str, Any]:
    """The JSON a lock file holds; {} when empty, missing or half-written."""
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lock_directory(directory: Path) -> int | None:
    """An exclusive flock on ``directory`` itself: its descriptor, or None if it is held."""
    return _flock_exclusive(os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)))


def _flock_exclusive(fd: int) -> int | None:
    """``fd`` with an exclusive flock taken without waiting; None (``fd`` closed) if another
    process holds it. Any other error closes ``fd`` and is raised."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def is_held(path: Path) -> bool:
    """Whether some process holds the lock on ``path``, a file or a directory (probes by
    trying to take it)."""
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def acquire_lock(config, *, host: str | None = None, port: int | None = None,
                 url: str | None = None) -> FileLock:
    """Take ``<data_dir>/reinf.pid`` for this serving process, or raise Conflict naming
    the process that holds it. A stale file (its process gone) is taken over."""
    path = lock_path(config)
    info = {"pid": os.getpid(), "url": url, "host": host or config.server.host,
            "port": port if port is not None else config.server.port,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "version": get_version(), "data_dir": str(config.data_dir)}
    path.parent.mkdir(parents=True, exist_ok=True)

    def take() -> FileLock | None:
        dir_fd = lock_directory(path.parent)  # first: it survives `rm reinf.pid`
        if dir_fd is None:
            return None
        try:
            lock = try_lock(path, info)
        except BaseException:
            os.close(dir_fd)
            raise
        if lock is None:
            os.close(dir_fd)
            return None
        lock.dir_fd = dir_fd
        return lock

    lock = _retry(take, RETRY_SECONDS)
    if lock is not None:
        return lock
    other = read_info(path)
    where = other.get("url") or (f"http://{other['host']}:{other['port']}"
                                 if other.get("host") else "starting up")
    if not path.exists():
        where = f"its {LOCK_NAME} was deleted; `ps` shows it"
    raise Conflict(f"another reinf serve (pid {other.get('pid', '?')}, {where}) is using "
                   f"{config.data_dir}",
                   fix="stop it first, or set REINF_HOME to another directory")


def _retry(take: Callable[[], FileLock | None], wait: float) -> FileLock | None:
    """``take()`` until it gives a lock or ``wait`` seconds have passed (at least one try);
    None if it never did. What ``take`` raises is raised at once."""
    deadline = time.monotonic() + wait
    while True:
        lock = take()
        if lock is not None or time.monotonic() >= deadline:
            return lock
        time.sleep(RETRY_INTERVAL)


def acquire_train_lock(config, *, trigger: str, wait: float = 0.0) -> FileLock | None:
    """Take ``<data_dir>/train.lock`` for one round, trying for up to ``wait`` seconds
    (the daemon's reconcile job and a starting server hold it for a moment); None while
    another round holds it. A lock file that cannot be written raises (lock_write_error)."""
    path = train_lock_path(config)
    info = {"pid": os.getpid(), "trigger": trigger,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return _retry(lambda: try_lock(path, info), wait)


def train_lock_holder(config) -> int | str:
    """The pid the train lock file names (``"?"`` when it names none)."""
    return read_info(train_lock_path(config)).get("pid", "?")


def read_lock(config) -> dict[str, Any]:
    """What ``reinf status`` shows about the server: its JSON plus whether it is held."""
    path = lock_path(config)
    # the directory's lock says it even when someone deleted reinf.pid
    held = is_held(path) or is_held(path.parent)
    info = read_info(path) if held else {}
    return {"running": held, "pid": info.get("pid"), "url": info.get("url"),
            "host": info.get("host"), "port": info.get("port"),
            "started_at": info.get("started_at"), "version": info.get("version"),
            "lock_file": str(path)}
