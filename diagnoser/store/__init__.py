"""Persistence: SQLAlchemy models, engines and alembic migrations."""
