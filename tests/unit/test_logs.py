"""The server's log file: where it is, rotation, and idempotent set-up."""
from __future__ import annotations

import logging
import os

import pytest

from reinf.logs import log_path, setup_logging


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


def test_library_warnings_reach_the_log_file_not_the_terminal(config, clean_root, capsys,
                                                              monkeypatch):
    import warnings

    from reinf.logs import quiet_libraries

    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "")  # recorded, so the test leaves it as found
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY")
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after
    setup_logging(config)
    quiet_libraries()
    # What warnings.warn ends in once a warning passes the filters (the suite's own
    # filters turn warnings into errors before they get here).
    warnings.showwarning("`past_key_values` is deprecated", FutureWarning, __file__, 1)
    logging.getLogger("transformers.modeling_utils").warning("a library notice")
    logging.getLogger("reinf.test").warning("ours, for the person")
    for handler in clean_root.handlers:
        handler.flush()
    err = capsys.readouterr().err
    assert "ours, for the person" in err
    assert "past_key_values" not in err and "a library notice" not in err
    text = log_path(config).read_text()
    # Python warnings are kept in the file; transformers' own logger, once transformers has
    # configured it (its own handler, no propagation, TRANSFORMERS_VERBOSITY=error), drops
    # its warnings: in no case do they reach the terminal (asserted above)
    assert "past_key_values" in text
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
