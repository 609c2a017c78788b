"""Shared fixtures, layered: home -> config -> store; runner for the CLI.

Every test gets its own REINF_HOME and an environment scrubbed of Reinf's
settings, so nothing leaks in from the developer's shell or ~/.reinf.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Before torch is imported anywhere (see reinf/__init__.py for why).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def _setting_env_names() -> set[str]:
    from reinf.config import ENV_PREFIX, settings

    names = {s.env for s in settings()}
    return names | {ENV_PREFIX + n for n in names} | {"REINF_HOME", "REINF_CONFIG"}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """A fresh data directory, set as REINF_HOME, with no stray settings in the env."""
    for name in _setting_env_names():
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "home"
    monkeypatch.setenv("REINF_HOME", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return path


@pytest.fixture
def config(home):
    from reinf.config import load_config

    return load_config(environ={"REINF_HOME": str(home)})


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> bytes:
    """The bytes of a database at the head revision, made once per worker process by the
    store's own code. A test's ``store`` starts from a copy: migrating a new SQLite file
    takes about 0.1 s, and hundreds of tests need one (the migrations themselves are
    tested from an empty database in test_migrations.py)."""
    from reinf.storage.store import Store

    path = tmp_path_factory.mktemp("migrated") / "reinf.db"
    Store(f"sqlite:///{path}").close()  # closing checkpoints the WAL into the file
    return path.read_bytes()


@pytest.fixture
def store(config, migrated_db):
    from reinf.storage.store import Store

    db_file = config.data_dir / "reinf.db"
    if config.storage.db_url is None and not db_file.exists():
        config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(db_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(migrated_db)
    s = Store.open(config)
    yield s
    s.close()


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run a reinf command in-process; returns the click Result."""
    from reinf.cli import main

    def run(*args, input=None):
        return runner.invoke(main, [str(a) for a in args], input=input,
                             catch_exceptions=False)
    return run


@pytest.fixture
def seeded(invoke, home):
    """A data directory (`reinf init --skip-model`) with one conversation of three turns
    (the CLI tests' turns 1-3)."""
    from reinf.config import load_config
    from reinf.storage.store import Store

    assert invoke("init", "--skip-model").exit_code == 0
    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    conv = store.create_conversation().id
    turns = [store.append_turn(conv, f"question {i}", f"answer {i}", reply_ids=[1], logprobs=[-1])
             for i in range(3)]
    store.close()
    return turns


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for subprocesses: the test's REINF_HOME, no stray settings."""
    drop = _setting_env_names()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(REINF_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL server for the session (tests/pg.py). Skips, saying why,
    when PostgreSQL or psycopg is not installed; REINF_TEST_PG=require (CI) fails instead."""
    import pg

    reason = pg.missing_reason()
    if reason:
        if os.environ.get("REINF_TEST_PG") == "require":
            pytest.fail(f"REINF_TEST_PG=require, but {reason}")
        pytest.skip(reason)
    server = pg.PgServer(pg.find_pg_bin()).start()
    yield server
    server.stop()


@pytest.fixture
def clean_root():
    """The root logger, put back as it was after the test (handlers the test added closed)."""
    import logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
