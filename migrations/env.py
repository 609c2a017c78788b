"""Alembic environment: runs migrations on the engine Reinf hands over.

reinf.storage.db.upgrade passes its configured Engine in ``config.attributes["engine"]``
so migrations see the same SQLite pragmas as the application. Run standalone
(``alembic -x url=...``) it builds an engine from the URL instead.
"""
from contextlib import contextmanager

from alembic import context
from sqlalchemy import create_engine, text

from reinf.storage.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        engine = create_engine(context.get_x_argument(as_dictionary=True).get(
            "url", config.get_main_option("sqlalchemy.url")))
    with engine.connect() as connection, _one_at_a_time(connection):
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies tables
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()


MIGRATION_LOCK = 0x7265696E66  # "reinf": the key of PostgreSQL's advisory lock


@contextmanager
def _one_at_a_time(connection):
    """Processes that first start at once on a new database (server, trainer, CLI) must not
    both migrate it: the loser would fail on "already exists". The others wait, then find
    the schema current. PostgreSQL: an advisory lock, held for the whole upgrade. SQLite:
    the whole upgrade in one transaction that takes the write lock up front
    (``BEGIN IMMEDIATE``; a failure also rolls all of it back)."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        connection.commit()  # the lock is the session's; alembic starts its own transactions
        try:
            yield
        finally:
            if not connection.invalidated:  # a lost connection took its lock with it
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": MIGRATION_LOCK})
                connection.commit()
    elif connection.dialect.name == "sqlite":
        connection.execution_options(sqlite_begin="IMMEDIATE")  # see reinf.storage.db
        with connection.begin():
            yield
    else:
        yield


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
