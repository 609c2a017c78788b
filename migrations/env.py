"""Alembic environment: runs migrations on the engine Reinf hands over.

reinf.db.upgrade passes its configured Engine in ``config.attributes["engine"]``
so migrations see the same SQLite pragmas as the application. Run standalone
(``alembic -x url=...``) it builds an engine from the URL instead.
"""
from alembic import context
from sqlalchemy import create_engine

from reinf.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        engine = create_engine(context.get_x_argument(as_dictionary=True).get(
            "url", config.get_main_option("sqlalchemy.url")))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies tables
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
