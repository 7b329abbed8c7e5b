"""Group commit: many uploads' commits share transactions, each keeping its compare-and-set."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import Connection, select

from diagnoser.ingest.streams import (
    JOBS,
    STREAMS,
    Progress,
    StreamCommit,
    commit_many,
    open_stream,
)
from diagnoser.ingest.writer import CommitGroup, WriteTotals
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[Sessions]:
    db = parse_database_url(database_url)
    upgrade(db)
    opened = Sessions(create_service_engine(db), db)
    yield opened
    await opened.close()


async def _streams(sessions: Sessions, job_id: str, count: int) -> list[int]:
    def create(conn: Connection) -> list[int]:
        return [
            open_stream(conn, job_id, f"node-{i}", f"node-{i}", None, {}).stream_id
            for i in range(count)
        ]

    return await sessions.run(create)


async def _committed(sessions: Sessions, job_id: str) -> tuple[dict[int, int], int, int]:
    def read(conn: Connection) -> tuple[dict[int, int], int, int]:
        rows = conn.execute(
            select(STREAMS.c.id, STREAMS.c.committed_offset).where(STREAMS.c.job_id == job_id)
        )
        job = conn.execute(
            select(JOBS.c.lines_received, JOBS.c.bytes_received).where(JOBS.c.id == job_id)
        ).one()
        return {row[0]: row[1] for row in rows}, job[0], job[1]

    return await sessions.run(read)


async def test_a_lost_race_fails_its_stream_alone(sessions: Sessions) -> None:
    """One transaction, three streams: the one whose offset moved meanwhile is refused, the
    others advance, and the job counts only what was committed."""
    first, second, third = await _streams(sessions, "job-a", 3)
    won = await sessions.run(
        lambda conn: commit_many(
            conn,
            [
                StreamCommit("job-a", third, Progress(0, 100, 10, 0)),
                StreamCommit("job-a", first, Progress(0, 50, 5, 0)),
                StreamCommit("job-a", second, Progress(7, 30, 3, 0)),  # another writer's view
            ],
        )
    )
    assert won == [True, True, False]
    offsets, lines, size = await _committed(sessions, "job-a")
    assert offsets == {first: 50, second: 0, third: 100}
    assert (lines, size) == (15, 150)


async def test_concurrent_commits_share_transactions(sessions: Sessions) -> None:
    """200 uploads committing at once take far fewer transactions than commits, and every
    stream ends exactly where its own commits put it."""
    ids = await _streams(sessions, "job-b", 200)
    totals = WriteTotals()
    group = CommitGroup(sessions, totals)

    async def upload(stream_id: int) -> list[bool]:
        results = []
        for step in range(3):
            progress = Progress(step * 100, (step + 1) * 100, 10, 0)
            results.append(await group.commit(StreamCommit("job-b", stream_id, progress)))
        return results

    outcomes = await asyncio.gather(*(upload(stream_id) for stream_id in ids))
    assert all(all(results) for results in outcomes)
    offsets, lines, size = await _committed(sessions, "job-b")
    assert offsets == dict.fromkeys(ids, 300)
    assert (lines, size) == (200 * 30, 200 * 300)
    assert totals.transactions <= 3 * 2  # 600 commits: a few transactions per round
