"""Everything stored: the ``Store`` (conversations, turns, ratings, pairs, runs,
checkpoints) over SQLAlchemy (``schema``, ``db``: engine and Alembic migrations), crash
recovery (``recover``), export and the data directory's permissions."""
