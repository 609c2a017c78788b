"""Log files: ``<data_dir>/logs/reinf.log``, rotated by size, for the serving process.

``setup_logging`` is called once by ``reinf serve`` (a second call changes nothing). The
file gets INFO and up (DEBUG with ``--debug``), including every stderr line of the child
trainer; the terminal gets WARNING and up (INFO with ``--debug``). Only the server writes
this file: a rotating handler in two processes would rename the file under the other.
The trainer's tracebacks go to ``logs/trainer.log`` (reinf.training.trainer).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_NAME = "reinf.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"
STDERR_FORMAT = "%(levelname)s %(name)s: %(message)s"
MARK = "_reinf_handler"
# Loggers whose records are for developers: they reach the log file, never the terminal
# (a person can do nothing about a library's deprecation notice). ``py.warnings`` holds
# Python warnings once ``quiet_libraries`` routes them through logging.
LIBRARY_LOGGERS = ("py.warnings", "transformers", "peft", "torch", "accelerate",
                   "huggingface_hub", "urllib3", "filelock")


class _NotLibraries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.name == n or record.name.startswith(n + ".")
                       for n in LIBRARY_LOGGERS)


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` that logs to ``py.warnings`` (an explicit ``file`` is
    written to, as the default does)."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    if file is not None:
        file.write(text)
        return
    logging.getLogger("py.warnings").warning("%s", text.rstrip())


def quiet_libraries(*, debug: bool = False) -> None:
    """Keep libraries' warnings (transformers, peft, torch, Python's ``warnings``) out of
    the terminal: they go to the log file, and to the terminal only with ``--debug``.

    transformers logs through its own handler at WARNING; ``TRANSFORMERS_VERBOSITY`` is the
    setting it reads when it first configures that logger (an environment variable already
    set wins). Python warnings go through logging (``py.warnings``), where the terminal
    handler's filter drops them. pytest's ``error`` filter still turns any warning into an
    error in the test suite: it acts before a warning is shown.
    """
    if debug:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # Our own hook, not logging.captureWarnings: that one installs itself only once per
    # process, so it stays off after anything (pytest, catch_warnings) restored the default.
    warnings.showwarning = _log_warning
    for handler in logging.getLogger().handlers:
        if getattr(handler, "stream", None) is sys.stderr and not any(
                isinstance(f, _NotLibraries) for f in handler.filters):
            handler.addFilter(_NotLibraries())


def log_path(config) -> Path:
    return config.data_dir / "logs" / LOG_NAME


def setup_logging(config, *, debug: bool = False) -> Path:
    """Attach the rotating file handler and the terminal handler to the root logger;
    returns the log file's path. Idempotent."""
    path = log_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    file_level = logging.DEBUG if debug else logging.INFO
    term_level = logging.INFO if debug else logging.WARNING
    ours = {getattr(h, MARK): h for h in root.handlers if getattr(h, MARK, None)}
    file_handler = ours.get("file")
    if file_handler is not None and Path(file_handler.baseFilename) != path.resolve():
        root.removeHandler(file_handler)  # another data directory (tests): start afresh
        file_handler.close()
        file_handler = None
    if file_handler is None:
        file_handler = RotatingFileHandler(path, maxBytes=config.storage.log_max_bytes,
                                           backupCount=config.storage.log_backups,
                                           encoding="utf-8", delay=False)
        file_handler.setFormatter(logging.Formatter(FORMAT))
        setattr(file_handler, MARK, "file")
        root.addHandler(file_handler)
    file_handler.setLevel(file_level)
    term = ours.get("stderr")
    if term is None:
        # Adopt a plain stderr handler (the CLI's basicConfig) rather than print twice.
        term = next((h for h in root.handlers if type(h) is logging.StreamHandler
                     and getattr(h, "stream", None) is sys.stderr), None)
        if term is None:
            term = logging.StreamHandler(sys.stderr)
            root.addHandler(term)
        term.setFormatter(logging.Formatter(STDERR_FORMAT))
        setattr(term, MARK, "stderr")
    term.setLevel(term_level)
    if not debug and not any(isinstance(f, _NotLibraries) for f in term.filters):
        term.addFilter(_NotLibraries())
    root.setLevel(min(file_level, term_level))
    # Third-party chatter (job bookkeeping, a migration check per status request) stays
    # out unless debugging.
    for name in ("apscheduler", "reinf.daemon.scheduler.jobs", "waitress.queue", "alembic"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
    return path
