"""Session-wide real servers, and a database URL fixture that runs tests on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import PostgresServer, RedisServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.init()
    server.start()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'diagnoser.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'diagnoser.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()
