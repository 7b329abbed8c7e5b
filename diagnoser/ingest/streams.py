"""Durable stream state: jobs and their byte streams, committed offsets advanced optimistically.

Plain synchronous SQLAlchemy Core on a `Connection`, one function per transaction, because
this is the ingest hot path: `Sessions.run` executes each as a single hop to the database
thread (SQLite) or one greenlet run (PostgreSQL), instead of a thread round trip per statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
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


SET_BASED_FROM = 4
"""Batches of at least this many commits are written set-based (`_commit_set`): one locking
read and one executemany per table instead of a statement per stream, about 5x cheaper per
commit at a group's usual size; a lone commit keeps its single compare-and-set statement."""

_LOCK_ROWS = (
    select(STREAMS.c.id, STREAMS.c.committed_offset)
    .where(STREAMS.c.id.in_(bindparam("b_ids", expanding=True)))
    .order_by(STREAMS.c.id)
    .with_for_update()
)
"""The batch's stream rows, locked in id order on PostgreSQL (`FOR UPDATE`; SQLite, one writer
at a time, has no row locks and ignores it)."""


class OffsetsMovedError(RuntimeError):
    """A stream offset changed between the batch's locking read and its update: the whole
    transaction is rolled back, and its uploads resend from the committed offset."""


def commit_many(conn: Connection, commits: Sequence[StreamCommit]) -> list[bool]:
    """Advance each stream's committed offset only if nobody else moved it, all in one
    transaction; per commit, False means a lost race (that stream only: the others stand).

    Rows are locked in one order (streams by id, then jobs by id), so two replicas committing
    overlapping batches on PostgreSQL wait for each other instead of deadlocking. Commits are
    decided in that order too, so two commits of one stream in a batch chain as they would one
    after the other.
    """
    now = utcnow()
    order = sorted(range(len(commits)), key=lambda i: commits[i].stream_id)
    if len(commits) >= SET_BASED_FROM:
        won = _commit_set(conn, commits, order, now)
    else:
        won = [False] * len(commits)
        for index in order:
            won[index] = _commit_one(conn, commits[index].stream_id, commits[index].progress, now)
    counts: dict[str, tuple[int, int]] = {}
    for commit, ok in zip(commits, won, strict=True):
        if ok:
            progress = commit.progress
            lines, size = counts.get(commit.job_id, (0, 0))
            counts[commit.job_id] = (
                lines + progress.lines,
                size + progress.to_offset - progress.from_offset,
            )
    if counts:
        conn.execute(
            _COUNT,
            [
                {"b_job": job_id, "b_lines": lines, "b_bytes": size, "b_now": now}
                for job_id, (lines, size) in sorted(counts.items())
            ],
        )
    return won


def _advance_params(stream_id: int, progress: Progress, now: datetime) -> dict[str, Any]:
    return {
        "b_id": stream_id,
        "b_from": progress.from_offset,
        "b_to": progress.to_offset,
        "b_lines": progress.lines,
        "b_truncated": progress.truncated_lines,
        "b_now": now,
    }


def _commit_one(conn: Connection, stream_id: int, progress: Progress, now: datetime) -> bool:
    return conn.execute(_ADVANCE, _advance_params(stream_id, progress, now)).rowcount == 1


def _commit_set(
    conn: Connection, commits: Sequence[StreamCommit], order: list[int], now: datetime
) -> list[bool]:
    """The batch's compare-and-sets decided on the rows as one locking read finds them, then
    the winners written by one executemany of the same guarded statement."""
    ids = sorted({commit.stream_id for commit in commits})
    offsets: dict[int, int] = {row[0]: row[1] for row in conn.execute(_LOCK_ROWS, {"b_ids": ids})}
    won = [False] * len(commits)
    params = []
    for index in order:
        commit = commits[index]
        progress = commit.progress
        if offsets.get(commit.stream_id) != progress.from_offset:
            continue
        offsets[commit.stream_id] = progress.to_offset
        won[index] = True
        params.append(_advance_params(commit.stream_id, progress, now))
    if params:
        updated = conn.execute(_ADVANCE, params).rowcount
        if conn.dialect.supports_sane_multi_rowcount and updated != len(params):
            raise OffsetsMovedError(
                f"{len(params) - updated} of {len(params)} stream offsets moved during the commit"
            )
    return won


def commit_progress(conn: Connection, job_id: str, stream_id: int, progress: Progress) -> bool:
    """Advance the committed offset only if nobody else moved it; False means a lost race."""
    return commit_many(conn, [StreamCommit(job_id, stream_id, progress)])[0]


def touch_job(conn: Connection, job_id: str) -> None:
    """Create the job if new and mark it active (lifecycle events, metadata updates)."""
    ensure_job(conn, job_id, {})
    conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(last_activity_at=utcnow()))
