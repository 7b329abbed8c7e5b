from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.store.database import (
    InvalidDatabaseUrlError,
    create_service_engine,
    parse_database_url,
)
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import DiagnosisRow, JobRow, LogStreamRow


@pytest.mark.parametrize(
    ("raw", "backend", "async_driver"),
    [
        ("sqlite:////var/lib/d.db", "sqlite", "sqlite+aiosqlite"),
        ("postgres://u:p@h:5432/db", "postgresql", "postgresql+psycopg"),
        ("postgresql://u@h/db", "postgresql", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql", "postgresql+psycopg"),
    ],
)
def test_accepts_the_spellings_people_paste(raw: str, backend: str, async_driver: str) -> None:
    parsed = parse_database_url(raw)
    assert parsed.backend == backend
    assert parsed.async_.drivername == async_driver


@pytest.mark.parametrize(
    ("raw", "needle"),
    [("mysql://u@h/db", "unsupported database backend 'mysql'"), ("not a url", "cannot parse")],
)
def test_rejects_unsupported_urls_with_a_reason(raw: str, needle: str) -> None:
    with pytest.raises(InvalidDatabaseUrlError, match=needle):
        parse_database_url(raw)


def test_password_is_hidden_when_printed() -> None:
    assert "hunter2" not in parse_database_url("postgresql://u:hunter2@h/db").redacted()


async def test_core_entities_round_trip(database_url: str) -> None:
    db = parse_database_url(database_url)
    upgrade(db)
    engine = create_service_engine(db)
    created = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    try:
        async with AsyncSession(engine) as session:
            session.add(JobRow(id="job-1", family="llama-70b", created_at=created))
            await session.flush()
            session.add(
                LogStreamRow(
                    job_id="job-1", stream="node-3/7", node="node-3", rank=7, committed_offset=2**40
                )
            )
            session.add(
                DiagnosisRow(
                    id="d-1",
                    job_id="job-1",
                    status="open",
                    source="rule",
                    action="cordon_node_and_restart",
                    culprit_nodes=["node-3"],
                    evidence=[{"node": "node-3", "text": "NVRM: Xid (PCI:0000:2b:00): 79"}],
                )
            )
            await session.commit()
        async with AsyncSession(engine) as session:
            job = await session.get(JobRow, "job-1")
            stream = (await session.scalars(select(LogStreamRow))).one()
            diagnosis = await session.get(DiagnosisRow, "d-1")
        assert job is not None
        assert diagnosis is not None
        assert job.created_at == created
        assert stream.committed_offset == 2**40  # offsets past 4 GiB survive
        assert diagnosis.culprit_nodes == ["node-3"]
        assert diagnosis.evidence[0]["text"].endswith(": 79")
        assert diagnosis.created_at.tzinfo is not None
        assert datetime.now(UTC) - diagnosis.created_at < timedelta(minutes=5)
    finally:
        await engine.dispose()


async def test_a_stream_is_unique_within_its_job(database_url: str) -> None:
    db = parse_database_url(database_url)
    upgrade(db)
    engine = create_service_engine(db)
    try:
        async with AsyncSession(engine) as session:
            session.add(JobRow(id="job-1"))
            await session.flush()
            session.add(LogStreamRow(job_id="job-1", stream="s", node="n"))
            await session.commit()
            session.add(LogStreamRow(job_id="job-1", stream="s", node="n"))
            with pytest.raises(IntegrityError):
                await session.commit()
    finally:
        await engine.dispose()
