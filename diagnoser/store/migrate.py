"""Alembic, driven from code: `diagnoser migrate`, the embedded default's self-migration, tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from diagnoser.store.database import DatabaseUrl, create_sync_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(db: DatabaseUrl) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolates '%': escape it so passwords with '%' survive.
    config.set_main_option(
        "sqlalchemy.url", db.sync.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config_for_scripts()).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def alembic_config_for_scripts() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(db: DatabaseUrl, revision: str = "head") -> None:
    """Bring the schema to `revision`; a no-op when it is already there."""
    if (path := db.sqlite_path) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_sync_engine(db)
    try:
        with engine.begin() as connection:
            config = alembic_config(db)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()
