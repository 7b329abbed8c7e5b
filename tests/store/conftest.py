"""The store tests' database: migrated to head, on each backend `database_url` gives."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[Sessions]:
    db = parse_database_url(database_url)
    upgrade(db)
    opened = Sessions(create_service_engine(db), db)
    yield opened
    await opened.close()
