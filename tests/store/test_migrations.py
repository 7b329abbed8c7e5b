from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from diagnoser.store.database import create_sync_engine, parse_database_url
from diagnoser.store.migrate import current_revision, head_revision, upgrade
from diagnoser.store.models import Base


def test_upgrade_from_empty_to_head_then_no_autogenerate_diff(database_url: str) -> None:
    db = parse_database_url(database_url)
    upgrade(db)
    upgrade(db)  # a second run is a no-op, as `diagnoser migrate` on every deploy
    engine = create_sync_engine(db)
    try:
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision()
            tables = set(inspect(connection).get_table_names())
            core = {"jobs", "log_streams", "job_events", "diagnoses", "actions", "filters"}
            assert core <= tables
            assert "filter_sets" not in tables
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
