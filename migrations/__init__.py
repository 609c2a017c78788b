"""Alembic migrations of Reinf's database (applied by reinf.storage.db.upgrade)."""
