"""Session-wide real servers, and a database URL fixture that runs tests on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnoser.store.database import parse_database_url
from diagnoser.store.migrate import upgrade
from tests.servers import PostgresServer, RedisServer, ServiceProcess

LONGEST_FIRST = (
    "tests/diagnosis/test_offline_llm.py",
    "tests/llm/test_local_model.py",
    "tests/templates/test_log_agent.py",
    "tests/templates/test_filters.py",
    "tests/templates/test_guard.py",
    "tests/api/test_ship_restart.py",
    "tests/examples/test_cluster_demo.py",
)
"""The files that keep a worker longest (CI's `--durations`), started first."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`--dist loadfile` hands out files in collection order. Alphabetically, the CPU-heavy
    template and real-model files came last, and the run ended with one or two workers
    finishing them while the others idled; started first, they overlap the many short files.
    A stable sort: every other file keeps its place, so every worker collects the same order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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


def backend_env(request: pytest.FixtureRequest, data_dir: Path) -> dict[str, str]:
    """Environment for `diagnoser serve` on the backend named by the fixture's param.

    PostgreSQL gets a fresh, migrated database (migration is the explicit step there).
    """
    env = {"DIAGNOSER_DATA_DIR": str(data_dir)}
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.create_database()
        upgrade(parse_database_url(url))
        env["DIAGNOSER_DB__URL"] = url
    return env


def run_service(env: dict[str, str]) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env=env)
    process.start()
    yield process
    process.stop()
