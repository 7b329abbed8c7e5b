"""Group commit: many uploads' commits share transactions, each keeping its compare-and-set;
their position reads share transactions too, each reading its own stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import Connection, select

from diagnoser.config import IngestSettings
from diagnoser.ingest.streams import (
    JOBS,
    STREAMS,
    Progress,
    StreamCommit,
    commit_many,
    open_stream,
)
from diagnoser.ingest.writer import (
    CommitGroup,
    IdleTimeoutError,
    PositionGroup,
    StreamBusyError,
    StreamLocks,
    StreamWriter,
    WriteTotals,
)
from diagnoser.pipeline import Pipeline, StreamKey
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


async def test_a_large_batch_decides_each_stream_as_one_commit_at_a_time(
    sessions: Sessions,
) -> None:
    """A group-sized batch (written set-based) with stale views, a stream that is gone and two
    chained commits of one stream: each commit wins or loses exactly as it would alone, in
    stream order, and the job counts only the winners."""
    ids = await _streams(sessions, "job-s", 40)
    batch = [
        StreamCommit("job-s", stream_id, Progress(0 if n % 5 else 3, 100 + n, n, n % 2))
        for n, stream_id in enumerate(ids)
    ]
    first = ids[1]
    batch.append(StreamCommit("job-s", first, Progress(101, 150, 4, 0)))  # chains on ids[1]
    batch.append(StreamCommit("job-s", first, Progress(0, 120, 9, 0)))  # stale after the chain
    batch.append(StreamCommit("job-s", -1, Progress(0, 10, 1, 0)))  # no such stream
    won = await sessions.run(lambda conn: commit_many(conn, batch))

    expected_won = [n % 5 != 0 for n in range(40)] + [True, False, False]
    assert won == expected_won
    offsets, lines, size = await _committed(sessions, "job-s")
    assert offsets == {
        stream_id: (0 if n % 5 == 0 else 150 if stream_id == first else 100 + n)
        for n, stream_id in enumerate(ids)
    }
    winners = [commit.progress for commit, ok in zip(batch, won, strict=True) if ok]
    assert lines == sum(p.lines for p in winners)
    assert size == sum(p.to_offset - p.from_offset for p in winners)


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


async def test_concurrent_position_reads_share_transactions(sessions: Sessions) -> None:
    """200 uploads starting at once read where their streams stand in far fewer transactions
    than reads, each its own stream's offset and lines; a stream that is gone reads None."""
    ids = await _streams(sessions, "job-c", 200)
    await sessions.run(
        lambda conn: commit_many(
            conn,
            [
                StreamCommit("job-c", stream_id, Progress(0, 10 * n, n, 0))
                for n, stream_id in enumerate(ids, 1)
            ],
        )
    )
    group = PositionGroup(sessions)
    positions = await asyncio.gather(*(group.read(stream_id) for stream_id in [*ids, -1]))
    *found, gone = positions
    assert gone is None
    assert [(p.stream_id, p.committed_offset, p.lines) for p in found if p is not None] == [
        (stream_id, 10 * n, n) for n, stream_id in enumerate(ids, 1)
    ]
    assert group.transactions <= 2
    # Later reads see later commits: nothing is cached between them.
    await sessions.run(
        lambda conn: commit_many(conn, [StreamCommit("job-c", ids[0], Progress(10, 25, 2, 0))])
    )
    again = await group.read(ids[0])
    assert again is not None
    assert (again.committed_offset, again.lines) == (25, 3)


async def _one_line_then_silence(started: asyncio.Event) -> AsyncIterator[bytes]:
    yield b"the line that arrived\n"
    started.set()
    await asyncio.Event().wait()  # the client stops sending, the upload stays open
    yield b"never\n"


async def test_an_idle_upload_times_out_with_what_arrived_committed(sessions: Sessions) -> None:
    """A body that goes silent is closed after the idle timeout; its line is committed."""
    writer = StreamWriter(
        sessions, Pipeline([]), IngestSettings(idle_timeout_s=0.05), StreamLocks()
    )
    key = StreamKey("job-idle", "n1", "n1", None)
    with pytest.raises(IdleTimeoutError) as raised:
        await writer.write(
            key, _one_line_then_silence(asyncio.Event()), offset=None, job_metadata={}
        )
    assert raised.value.outcome.lines_accepted == 1
    assert raised.value.outcome.next_offset == len(b"the line that arrived\n")


async def test_cancelling_a_silent_upload_is_a_cancellation_not_a_timeout(
    sessions: Sessions,
) -> None:
    """Stopping the server while an upload waits for bytes cancels it (the idle timeout does
    not claim the cancellation), and what arrived is committed."""
    writer = StreamWriter(sessions, Pipeline([]), IngestSettings(), StreamLocks())
    key = StreamKey("job-stop", "n1", "n1", None)
    started = asyncio.Event()
    upload = asyncio.create_task(
        writer.write(key, _one_line_then_silence(started), offset=None, job_metadata={})
    )
    await started.wait()
    upload.cancel()
    with pytest.raises(asyncio.CancelledError):
        await upload
    position = await sessions.run(lambda conn: open_stream(conn, "job-stop", "n1", "n1", None, {}))
    assert position.committed_offset == len(b"the line that arrived\n")


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_a_sole_writer_starts_where_its_last_commit_left_the_stream(
    sessions: Sessions,
) -> None:
    """With one process writing (the embedded database), the uploads after a stream's first
    read none: each starts at the offset and line count its predecessor committed, and a
    resend from an older offset still loses exactly its duplicate bytes."""
    writer = StreamWriter(sessions, Pipeline([]), IngestSettings(), StreamLocks(), sole_writer=True)
    key = StreamKey("job-sole", "n1", "n1", None)
    first = await writer.write(key, _body(b"a\nb\n"), offset=0, job_metadata={})
    second = await writer.write(key, _body(b"c\n"), offset=4, job_metadata={})
    resent = await writer.write(key, _body(b"b\nc\nd\n"), offset=2, job_metadata={})

    assert writer.positions.transactions == 0
    assert (first.next_offset, first.stream_lines) == (4, 2)
    assert (second.next_offset, second.stream_lines) == (6, 3)
    assert (resent.lines_accepted, resent.duplicate_bytes) == (1, 4)
    assert (resent.next_offset, resent.stream_lines) == (8, 4)
    offsets, lines, size = await _committed(sessions, "job-sole")
    assert list(offsets.values()) == [8]
    assert (lines, size) == (4, 8)


async def test_a_sole_writer_reads_the_stream_again_after_a_lost_race(
    sessions: Sessions,
) -> None:
    """If the stream moved behind a sole writer's back after all (the offset is still
    compare-and-set), that upload fails as busy and the next one reads where it stands."""
    writer = StreamWriter(sessions, Pipeline([]), IngestSettings(), StreamLocks(), sole_writer=True)
    key = StreamKey("job-moved", "n1", "n1", None)
    await writer.write(key, _body(b"a\n"), offset=0, job_metadata={})
    position = await sessions.run(lambda conn: open_stream(conn, "job-moved", "n1", "n1", None, {}))
    await sessions.run(
        lambda conn: commit_many(
            conn, [StreamCommit("job-moved", position.stream_id, Progress(2, 6, 2, 0))]
        )
    )
    with pytest.raises(StreamBusyError):
        await writer.write(key, _body(b"x\n"), offset=2, job_metadata={})
    after = await writer.write(key, _body(b"e\n"), offset=6, job_metadata={})
    assert writer.positions.transactions == 1
    assert (after.next_offset, after.stream_lines, after.lines_accepted) == (8, 4, 1)


async def test_replicas_read_the_stream_at_every_upload(sessions: Sessions) -> None:
    """Without the sole-writer promise (several replicas on PostgreSQL), every upload of a
    known stream reads its position, so one written elsewhere meanwhile is seen at once."""
    writer = StreamWriter(sessions, Pipeline([]), IngestSettings(), StreamLocks())
    key = StreamKey("job-shared", "n1", "n1", None)
    await writer.write(key, _body(b"a\n"), offset=0, job_metadata={})
    position = await sessions.run(
        lambda conn: open_stream(conn, "job-shared", "n1", "n1", None, {})
    )
    await sessions.run(
        lambda conn: commit_many(
            conn, [StreamCommit("job-shared", position.stream_id, Progress(2, 6, 2, 0))]
        )
    )
    after = await writer.write(key, _body(b"e\n"), offset=6, job_metadata={})
    assert writer.positions.transactions == 1
    assert (after.next_offset, after.stream_lines, after.lines_accepted) == (8, 4, 1)


async def _lines_then_wait(lines: list[bytes], hold: asyncio.Event) -> AsyncIterator[bytes]:
    for line in lines:
        yield line
    await hold.wait()  # the shipper's upload stays open, silent


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)


async def _committed_offset(sessions: Sessions, job_id: str, stream: str) -> int:
    position = await sessions.run(lambda conn: open_stream(conn, job_id, stream, stream, None, {}))
    return position.committed_offset


async def test_open_uploads_are_committed_together_at_the_tick(sessions: Sessions) -> None:
    """300 uploads that stay open after their lines: each line is committed within the tick
    while its upload is still open, in a few transactions for all, and each job's diagnosis
    is settled once per tick, not once per upload."""
    settled: list[str] = []

    async def settle(key: StreamKey) -> list[str]:
        settled.append(key.job_id)
        return []

    writer = StreamWriter(
        sessions,
        Pipeline([]),
        IngestSettings(commit_every_s=0.2),
        StreamLocks(),
        after_commit=settle,
    )
    hold = asyncio.Event()
    keys = [StreamKey(f"job-t{n % 3}", f"n{n}", f"n{n}", None) for n in range(300)]
    uploads = [
        asyncio.create_task(
            writer.write(key, _lines_then_wait([b"a\n", b"bb\n"], hold), offset=0, job_metadata={})
        )
        for key in keys
    ]
    await _until(lambda: writer.totals.commits >= 300)
    assert not any(upload.done() for upload in uploads)
    assert writer.totals.commits == 300
    assert {await _committed_offset(sessions, k.job_id, k.stream) for k in keys[::37]} == {5}
    assert writer.totals.transactions <= 2 * writer.ticker.ticks
    assert set(settled) == {"job-t0", "job-t1", "job-t2"}
    assert len(settled) <= 3 * writer.ticker.ticks < 30
    hold.set()
    outcomes = await asyncio.gather(*uploads)
    assert {(o.lines_accepted, o.next_offset) for o in outcomes} == {(2, 5)}
    assert writer.totals.commits == 300  # nothing left to commit at the end


async def test_a_timed_commit_that_loses_its_race_fails_its_upload_alone(
    sessions: Sessions,
) -> None:
    """A sole writer's stream is moved behind its back between two uploads: the second
    upload's timed commit is refused, and that upload (only) fails as busy at its next chunk;
    the upload of another stream open at the same tick is committed."""
    writer = StreamWriter(
        sessions,
        Pipeline([]),
        IngestSettings(commit_every_s=0.1),
        StreamLocks(),
        sole_writer=True,
    )
    moved, kept = (
        StreamKey("job-r", "moved", "moved", None),
        StreamKey("job-r", "kept", "kept", None),
    )
    first = await writer.write(moved, _body(b"first\n"), offset=0, job_metadata={})
    position = await sessions.run(
        lambda conn: open_stream(conn, "job-r", "moved", "moved", None, {})
    )
    won = await sessions.run(  # another process writes the stream: the writer does not know
        lambda conn: commit_many(
            conn, [StreamCommit("job-r", position.stream_id, Progress(6, 9, 1, 0))]
        )
    )
    assert won == [True]
    go_on = asyncio.Event()

    async def body(*lines: bytes) -> AsyncIterator[bytes]:
        yield lines[0]
        await go_on.wait()
        yield lines[1]

    ticks = writer.ticker.ticks
    racing = asyncio.create_task(
        writer.write(moved, body(b"second\n", b"third\n"), offset=6, job_metadata={})
    )
    calm = asyncio.create_task(
        writer.write(kept, body(b"first\n", b"second\n"), offset=0, job_metadata={})
    )
    await _until(lambda: writer.ticker.ticks >= ticks + 2)
    assert await _committed_offset(sessions, "job-r", "kept") == len(b"first\n")
    go_on.set()
    with pytest.raises(StreamBusyError):
        await racing
    assert first.next_offset == 6
    assert (await calm).next_offset == len(b"first\nsecond\n")
    assert await _committed_offset(sessions, "job-r", "moved") == 9
