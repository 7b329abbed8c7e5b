"""Durable stream state: jobs and their byte streams, committed offsets advanced optimistically."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.store.models import JobRow, LogStreamRow, utcnow

JOB_METADATA_FIELDS = ("family", "framework", "namespace", "kind", "name")


def default_stream_id(node: str, rank: int | None) -> str:
    return node if rank is None else f"{node}/{rank}"


async def insert_ignoring_conflict(
    session: AsyncSession, table: Table, values: dict[str, Any]
) -> None:
    """INSERT that is a no-op when the row exists: two first requests may race, neither fails."""
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    await session.execute(insert(table).values(**values).on_conflict_do_nothing())


async def ensure_job(session: AsyncSession, job_id: str, metadata: dict[str, str]) -> None:
    """Create the job on first contact; metadata given later fills fields still empty."""
    now = utcnow()
    await insert_ignoring_conflict(
        session,
        JobRow.__table__,  # type: ignore[arg-type]
        {
            "id": job_id,
            "created_at": now,
            "last_activity_at": now,
            "lines_received": 0,
            "bytes_received": 0,
            **metadata,
        },
    )
    if metadata:
        job = await session.get(JobRow, job_id)
        if job is not None:
            for key, value in metadata.items():
                if getattr(job, key) is None:
                    setattr(job, key, value)


async def get_or_create_stream(
    session: AsyncSession, job_id: str, stream: str, node: str, rank: int | None
) -> LogStreamRow:
    await insert_ignoring_conflict(
        session,
        LogStreamRow.__table__,  # type: ignore[arg-type]
        {
            "job_id": job_id,
            "stream": stream,
            "node": node,
            "rank": rank,
            "committed_offset": 0,
            "lines": 0,
            "truncated_lines": 0,
            "created_at": utcnow(),
            "updated_at": utcnow(),
        },
    )
    row = await session.scalar(
        select(LogStreamRow).where(LogStreamRow.job_id == job_id, LogStreamRow.stream == stream)
    )
    if row is None:  # deleted between the insert and the select: the job was removed
        raise LookupError(f"stream {stream!r} of job {job_id!r} vanished")
    return row


async def stream_position(session: AsyncSession, stream_id: int) -> tuple[int, int] | None:
    """(committed offset, lines) of a stream, or None if it no longer exists."""
    row = (
        await session.execute(
            select(LogStreamRow.committed_offset, LogStreamRow.lines).where(
                LogStreamRow.id == stream_id
            )
        )
    ).first()
    return None if row is None else (row[0], row[1])


@dataclass(frozen=True, slots=True)
class Progress:
    """What one commit adds to a stream, relative to the offset it started from."""

    from_offset: int
    to_offset: int
    lines: int
    truncated_lines: int


async def commit_progress(
    session: AsyncSession, job_id: str, stream_id: int, progress: Progress
) -> bool:
    """Advance the committed offset only if nobody else moved it; False means a lost race."""
    now = utcnow()
    result = await session.execute(
        update(LogStreamRow)
        .where(
            LogStreamRow.id == stream_id,
            LogStreamRow.committed_offset == progress.from_offset,
        )
        .values(
            committed_offset=progress.to_offset,
            lines=LogStreamRow.lines + progress.lines,
            truncated_lines=LogStreamRow.truncated_lines + progress.truncated_lines,
            updated_at=now,
        )
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    await session.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(
            lines_received=JobRow.lines_received + progress.lines,
            bytes_received=JobRow.bytes_received + (progress.to_offset - progress.from_offset),
            last_activity_at=now,
        )
    )
    return True
