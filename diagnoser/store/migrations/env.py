"""Alembic environment: runs on the connection handed in by diagnoser.store.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from diagnoser.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.begin() as conn:
        run_on(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `diagnoser migrate`")
run_online()
