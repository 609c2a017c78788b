"""Database connections and migrations.

SQLite runs with WAL (readers never block the writer), a busy timeout (writers
queue instead of failing), foreign keys, and secure_delete (forgotten text is
overwritten, not left in free pages). Write transactions start with
``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a read lock to a
write lock, which is where "database is locked" errors come from.

Migrations live in the top-level ``migrations/`` package and are applied with
Alembic at start-up and by ``reinf db upgrade``. A failure is raised, never
swallowed.
"""
from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
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
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
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
        log.exception("migration failed")
        raise StoreError(f"database migration to {revision} failed: {type(exc).__name__}: {exc}",
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
