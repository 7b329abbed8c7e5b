"""Database URLs and engines for the two supported backends: SQLite (embedded) and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

T = TypeVar("T")
SYNC_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}
ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


class InvalidDatabaseUrlError(ValueError):
    """The URL cannot be parsed or names a backend diagnoser does not support."""


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """One database, spelled for the sync driver (migrations) and the async one (the service)."""

    backend: str
    sync: URL
    async_: URL

    @property
    def sqlite_path(self) -> Path | None:
        if self.backend != "sqlite" or not self.sync.database or self.sync.database == ":memory:":
            return None
        return Path(self.sync.database)

    def redacted(self) -> str:
        return self.sync.render_as_string(hide_password=True)


def parse_database_url(raw: str) -> DatabaseUrl:
    """Accept the spellings people paste (postgres://, postgresql://, sqlite:///...)."""
    text = raw.strip()
    if text.startswith("postgres://"):
        text = "postgresql://" + text.removeprefix("postgres://")
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise InvalidDatabaseUrlError(f"cannot parse database URL {raw!r}") from exc
    backend = url.get_backend_name()
    if backend not in SYNC_DRIVERS:
        raise InvalidDatabaseUrlError(
            f"unsupported database backend {backend!r} in {raw!r}: use sqlite:///PATH "
            "or postgresql+psycopg://USER@HOST:PORT/DB"
        )
    if backend == "sqlite" and not url.database:
        raise InvalidDatabaseUrlError("a SQLite URL needs a file path: sqlite:////abs/path.db")
    return DatabaseUrl(
        backend=backend,
        sync=url.set(drivername=SYNC_DRIVERS[backend]),
        async_=url.set(drivername=ASYNC_DRIVERS[backend]),
    )


def _connect_args(db: DatabaseUrl, connect_timeout_s: float) -> dict[str, Any]:
    if db.backend == "postgresql":
        return {"connect_timeout": max(1, round(connect_timeout_s))}
    return {"timeout": connect_timeout_s}


def _tune_sqlite(engine: Engine) -> None:
    """WAL lets readers run beside the single writer; foreign keys are off by default in SQLite."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.close()


def create_sync_engine(db: DatabaseUrl, *, connect_timeout_s: float = 3.0) -> Engine:
    engine = create_engine(
        db.sync, connect_args=_connect_args(db, connect_timeout_s), pool_pre_ping=True
    )
    if db.backend == "sqlite":
        _tune_sqlite(engine)
    return engine


def create_service_engine(
    db: DatabaseUrl, *, pool_size: int = 10, connect_timeout_s: float = 3.0, echo: bool = False
) -> AsyncEngine:
    """The service's engine; pre-ping lets it recover by itself when the server comes back."""
    kwargs: dict[str, Any] = {"connect_args": _connect_args(db, connect_timeout_s), "echo": echo}
    if db.backend == "postgresql":
        kwargs["pool_size"] = pool_size
        kwargs["pool_pre_ping"] = True  # a local file needs no ping; a server may have restarted
    engine = create_async_engine(db.async_, **kwargs)
    if db.backend == "sqlite":
        _tune_sqlite(engine.sync_engine)
    return engine


class Sessions:
    """Sessions for the service, and the two ways it writes.

    `begin()` is an ORM write transaction (rare writes: diagnoses, feedback). `run(fn)` runs
    `fn(connection)` as one transaction of plain Core statements, for the ingest hot path: on
    SQLite it is one hop to a single writer thread with a synchronous connection (aiosqlite
    costs a thread round trip per statement, about 10x the statement itself), and that one
    thread also queues writers fairly, where SQLite's busy handler would not. `begin()` on
    SQLite queues on an asyncio lock for the same reason. PostgreSQL needs neither.
    Drop-in for an `async_sessionmaker`: `sessions()` and `sessions.begin()`.
    """

    def __init__(
        self, engine: AsyncEngine, db: DatabaseUrl, *, connect_timeout_s: float = 3.0
    ) -> None:
        self.engine = engine
        self.factory = async_sessionmaker(engine, expire_on_commit=False)
        sqlite = db.backend == "sqlite"
        self._gate = asyncio.Lock() if sqlite else None
        self._writer = (
            create_sync_engine(db, connect_timeout_s=connect_timeout_s) if sqlite else None
        )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer") if sqlite else None

    def __call__(self) -> AsyncSession:
        return self.factory()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncSession]:
        if self._gate is None:
            async with self.factory.begin() as session:
                yield session
            return
        async with self._gate, self.factory.begin() as session:
            yield session

    async def run(self, fn: Callable[[Connection], T]) -> T:
        """`fn(connection)` in one transaction, committed when it returns."""
        if self._writer is None or self._thread is None:
            async with self.engine.begin() as connection:
                return await connection.run_sync(fn)
        writer = self._writer

        def transaction() -> T:
            with writer.begin() as connection:
                return fn(connection)

        return await asyncio.get_running_loop().run_in_executor(self._thread, transaction)

    async def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        if self._writer is not None:
            self._writer.dispose()
        await self.engine.dispose()
