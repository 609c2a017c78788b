"""Alembic migrations of Reinf's database (applied by reinf.db.upgrade)."""
