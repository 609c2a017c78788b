"""Who may read the data: the data directory 700, its files 600, on real files.

Every test runs under the usual umask 022, which made ``~/.reinf`` 755 and ``reinf.db``
644 before; what Reinf creates must be private anyway, and what an older Reinf left open
is tightened at start-up with one line on stderr.
"""
from __future__ import annotations

import logging
import os
import stat

import pytest

from reinf.storage import permissions

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_the_store_makes_a_private_data_directory_and_database(config, capfd):
    from reinf.storage.store import Store

    store = Store.open(config)
    try:
        store.create_conversation()  # a write: the -wal and -shm files exist now
        db = config.data_dir / "reinf.db"
        assert mode(config.data_dir) == 0o700
        assert {p.name: mode(p) for p in config.data_dir.glob("reinf.db*")} == {
            "reinf.db": 0o600, "reinf.db-wal": 0o600, "reinf.db-shm": 0o600}
        assert db.stat().st_size > 0
    finally:
        store.close()
    assert "tightened" not in capfd.readouterr().err  # made private, nothing to tighten


def test_the_cli_writes_everything_private_and_gives_the_umask_back(home, invoke):
    out = invoke("init", "--skip-model")
    assert out.exit_code == 0, out.output
    assert "tightened" not in out.output
    for name in ("", "logs", "checkpoints"):
        assert mode(home / name) == 0o700, name
    for name in ("reinf.db", "config.yaml", "reward_mapper.py"):
        assert mode(home / name) == 0o600, name
    assert os.umask(0o022) == 0o022  # restored when the command ended


def test_files_made_after_the_cli_starts_are_private(home, clean_root):
    """The log handler and the trainer child (which inherits the umask) create files
    after start-up: logs and checkpoint directories come out 700/600."""
    import subprocess
    import sys

    from reinf.cli.common import AppContext
    from reinf.logs import setup_logging

    app = AppContext(home=str(home))
    try:
        log_file = setup_logging(app.config)
        logging.getLogger("reinf.test").warning("a line")
        child = home / "checkpoints" / "r0001"
        subprocess.run([sys.executable, "-c", "import os, sys; os.makedirs(sys.argv[1]); "
                        "open(os.path.join(sys.argv[1], 'metrics.json'), 'w').close()",
                        str(child)], check=True)
    finally:
        app.close()
    assert mode(log_file.parent) == 0o700 and mode(log_file) == 0o600
    assert mode(child) == 0o700 and mode(child / "metrics.json") == 0o600


def test_an_open_data_directory_is_tightened_once_with_one_line(home, invoke):
    from reinf.config import load_config
    from reinf.storage.store import Store

    Store.open(load_config(environ={"REINF_HOME": str(home)})).close()  # the database
    ckpt = home / "checkpoints" / "r0001"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_model.safetensors").write_text("x")
    (home / "logs").mkdir()
    (home / "logs" / "reinf.log").write_text("old\n")
    outside = home.parent / "elsewhere.txt"
    outside.write_text("not Reinf's")
    (home / "logs" / "link").symlink_to(outside)
    for path in (home, home / "logs", home / "checkpoints", ckpt):  # as an older Reinf left them
        os.chmod(path, 0o755)
    for path in (home / "reinf.db", home / "logs" / "reinf.log", outside):
        os.chmod(path, 0o644)

    first = invoke("history")
    lines = [line for line in first.stderr.splitlines() if "tightened" in line]
    assert lines == [f"tightened permissions of {home} to 700 and of 6 paths in it to "
                     "700/600 (they were readable by other users)"], first.stderr
    assert mode(home) == mode(home / "logs") == mode(home / "checkpoints") == mode(ckpt) == 0o700
    assert mode(home / "logs" / "reinf.log") == mode(home / "reinf.db") == 0o600
    assert mode(ckpt / "adapter_model.safetensors") == 0o600
    assert mode(outside) == 0o644  # a link is not followed out of the data directory
    assert "tightened" not in invoke("history").stderr  # nothing left to say


def test_the_store_tightens_too(config, capfd):
    """Opened without the CLI (the web app in tests, a script), the store does it."""
    from reinf.storage.store import Store

    config.data_dir.mkdir(mode=0o755)
    Store.open(config).close()
    assert mode(config.data_dir) == 0o700
    err = capfd.readouterr().err
    assert f"tightened permissions of {config.data_dir} to 700 (it was readable" in err


def test_export_to_a_file_is_private_even_over_an_open_one(home, invoke, tmp_path):
    from reinf.config import load_config
    from reinf.storage.store import Store

    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    store.rate(store.append_turn(store.create_conversation().id, "q", "a").id, 5)
    store.close()
    fresh, existing = tmp_path / "fresh.jsonl", tmp_path / "existing.jsonl"
    existing.write_text("old rows\n")
    os.chmod(existing, 0o644)
    for target in (fresh, existing):
        out = invoke("export", "-o", target)
        assert out.exit_code == 0 and "wrote 1 row (raw)" in out.stderr
        assert mode(target) == 0o600 and target.read_text().count("\n") == 1


def test_off_posix_nothing_is_changed(home, monkeypatch):
    home.mkdir(mode=0o755)
    monkeypatch.setattr(permissions, "POSIX", False)
    assert permissions.tighten(home) == [] and permissions.use_private_umask() is None
    assert mode(home) == 0o755


def test_tightening_keeps_a_read_only_data_directory_read_only(tmp_path):
    """A person who made the data directory 555 made it read-only on purpose: it stays as
    it is (it once became 700, writable again, and the server started in it); every
    command then stops with one line naming it (tests/e2e/test_faults.py)."""
    from reinf.storage.permissions import tighten

    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    try:
        assert tighten(home) == [] and mode(home) == 0o555
    finally:
        home.chmod(0o755)
    assert tighten(home) == [home] and mode(home) == 0o700  # writable: tightened as ever
