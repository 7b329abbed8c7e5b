"""Durable stream state: jobs and their byte streams, committed offsets advanced optimistically.

Plain synchronous SQLAlchemy Core on a `Connection`, one function per transaction, because
this is the ingest hot path: `Sessions.run` executes each as a single hop to the database
thread (SQLite) or one greenlet run (PostgreSQL), instead of a thread round trip per statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from diagnoser.store.models import JobRow, LogStreamRow, utcnow

JOB_METADATA_FIELDS = ("family", "framework", "namespace", "kind", "name")
JOBS: Table = JobRow.__table__  # type: ignore[assignment]
STREAMS: Table = LogStreamRow.__table__  # type: ignore[assignment]


def default_stream_id(node: str, rank: int | None) -> str:
    return node if rank is None else f"{node}/{rank}"


def insert_ignoring_conflict(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """INSERT that is a no-op when the row exists: two first requests may race, neither fails."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    conn.execute(insert(table).values(**values).on_conflict_do_nothing())


def ensure_job(conn: Connection, job_id: str, metadata: dict[str, str]) -> None:
    """Create the job on first contact; metadata given later fills fields still empty."""
    now = utcnow()
    insert_ignoring_conflict(
        conn,
        JOBS,
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
        conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id)
            .values({key: func.coalesce(JOBS.c[key], value) for key, value in metadata.items()})
        )


class StreamPosition(NamedTuple):
    stream_id: int
    committed_offset: int
    lines: int


def open_stream(
    conn: Connection,
    job_id: str,
    stream: str,
    node: str,
    rank: int | None,
    metadata: dict[str, str],
) -> StreamPosition:
    """Create the job and the stream if new; where the stream stands now."""
    ensure_job(conn, job_id, metadata)
    now = utcnow()
    insert_ignoring_conflict(
        conn,
        STREAMS,
        {
            "job_id": job_id,
            "stream": stream,
            "node": node,
            "rank": rank,
            "committed_offset": 0,
            "lines": 0,
            "truncated_lines": 0,
            "created_at": now,
            "updated_at": now,
        },
    )
    row = conn.execute(
        select(STREAMS.c.id, STREAMS.c.committed_offset, STREAMS.c.lines).where(
            STREAMS.c.job_id == job_id, STREAMS.c.stream == stream
        )
    ).one()
    return StreamPosition(row[0], row[1], row[2])


_POSITION = select(STREAMS.c.committed_offset, STREAMS.c.lines).where(
    STREAMS.c.id == bindparam("b_id")
)
"""Built once, as `_ADVANCE` below: every upload of a known stream starts with it."""


def stream_position(conn: Connection, stream_id: int) -> StreamPosition | None:
    """Where a known stream stands, or None if it no longer exists."""
    row = conn.execute(_POSITION, {"b_id": stream_id}).first()
    return None if row is None else StreamPosition(stream_id, row[0], row[1])


_POSITIONS = select(STREAMS.c.id, STREAMS.c.committed_offset, STREAMS.c.lines).where(
    STREAMS.c.id.in_(bindparam("b_ids", expanding=True))
)


def stream_positions(conn: Connection, stream_ids: Sequence[int]) -> dict[int, StreamPosition]:
    """Where each of several known streams stands, in one statement (streams that no longer
    exist are missing)."""
    if not stream_ids:
        return {}
    rows = conn.execute(_POSITIONS, {"b_ids": list(stream_ids)})
    return {row[0]: StreamPosition(row[0], row[1], row[2]) for row in rows}


@dataclass(frozen=True, slots=True)
class Progress:
    """What one commit adds to a stream, relative to the offset it started from."""

    from_offset: int
    to_offset: int
    lines: int
    truncated_lines: int


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """One stream's `Progress`, to be committed with others in one transaction."""

    job_id: str
    stream_id: int
    progress: Progress


_ADVANCE = (
    update(STREAMS)
    .where(STREAMS.c.id == bindparam("b_id"), STREAMS.c.committed_offset == bindparam("b_from"))
    .values(
        committed_offset=bindparam("b_to"),
        lines=STREAMS.c.lines + bindparam("b_lines"),
        truncated_lines=STREAMS.c.truncated_lines + bindparam("b_truncated"),
        updated_at=bindparam("b_now", type_=STREAMS.c.updated_at.type),
    )
)
_COUNT = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("b_job"))
    .values(
        lines_received=JOBS.c.lines_received + bindparam("b_lines"),
        bytes_received=JOBS.c.bytes_received + bindparam("b_bytes"),
        last_activity_at=bindparam("b_now", type_=JOBS.c.last_activity_at.type),
    )
)
"""Built once: the ingest hot path runs them thousands of times a second, and building an
expression costs more than executing it."""


def commit_many(conn: Connection, commits: Sequence[StreamCommit]) -> list[bool]:
    """Advance each stream's committed offset only if nobody else moved it, all in one
    transaction; per commit, False means a lost race (that stream only: the others stand).

    Rows are locked in one order (streams by id, then jobs by id), so two replicas committing
    overlapping batches on PostgreSQL wait for each other instead of deadlocking.
    """
    now = utcnow()
    won = [False] * len(commits)
    counts: dict[str, tuple[int, int]] = {}
    for index in sorted(range(len(commits)), key=lambda i: commits[i].stream_id):
        commit = commits[index]
        progress = commit.progress
        result = conn.execute(
            _ADVANCE,
            {
                "b_id": commit.stream_id,
                "b_from": progress.from_offset,
                "b_to": progress.to_offset,
                "b_lines": progress.lines,
                "b_truncated": progress.truncated_lines,
                "b_now": now,
            },
        )
        if result.rowcount != 1:
            continue
        won[index] = True
        lines, size = counts.get(commit.job_id, (0, 0))
        counts[commit.job_id] = (
            lines + progress.lines,
            size + progress.to_offset - progress.from_offset,
        )
    for job_id in sorted(counts):
        lines, size = counts[job_id]
        conn.execute(_COUNT, {"b_job": job_id, "b_lines": lines, "b_bytes": size, "b_now": now})
    return won


def commit_progress(conn: Connection, job_id: str, stream_id: int, progress: Progress) -> bool:
    """Advance the committed offset only if nobody else moved it; False means a lost race."""
    return commit_many(conn, [StreamCommit(job_id, stream_id, progress)])[0]


def touch_job(conn: Connection, job_id: str) -> None:
    """Create the job if new and mark it active (lifecycle events, metadata updates)."""
    ensure_job(conn, job_id, {})
    conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(last_activity_at=utcnow()))
