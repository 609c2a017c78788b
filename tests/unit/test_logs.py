"""The server's log file: where it is, rotation, and idempotent set-up."""
from __future__ import annotations

import logging

import pytest

from reinf.logs import log_path, setup_logging


@pytest.fixture
def clean_root():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_log_file_rotates_and_setup_is_idempotent(config, clean_root):
    cfg = config.replace(log_max_bytes=10_000, log_backups=2)
    path = setup_logging(cfg)
    assert path == log_path(cfg) == cfg.data_dir / "logs" / "reinf.log"
    count = len(clean_root.handlers)
    assert setup_logging(cfg) == path and len(clean_root.handlers) == count
    log = logging.getLogger("reinf.test")
    log.info("hello from the daemon")
    log.debug("not without --debug")
    for i in range(400):
        log.info("line %d %s", i, "x" * 60)
    for handler in clean_root.handlers:
        handler.flush()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["reinf.log", "reinf.log.1", "reinf.log.2"]
    assert all(p.stat().st_size <= 10_000 for p in path.parent.iterdir())
    text = "".join(p.read_text() for p in path.parent.iterdir())
    assert "not without --debug" not in text and "line 399" in text


def test_terminal_gets_warnings_only_unless_debug(config, clean_root, capsys):
    setup_logging(config)
    logging.getLogger("reinf.test").info("quiet info")
    logging.getLogger("reinf.test").warning("loud warning")
    err = capsys.readouterr().err
    assert "loud warning" in err and "quiet info" not in err
    setup_logging(config, debug=True)
    logging.getLogger("reinf.test").debug("debug line")
    for handler in clean_root.handlers:
        handler.flush()
    assert "debug line" in log_path(config).read_text()
