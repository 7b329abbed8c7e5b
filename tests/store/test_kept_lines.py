"""A job's compressed log in real SQLite and PostgreSQL: bounded, pruned, read by any replica."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.rules import RuleRegistry, make_batch
from diagnoser.store.database import Sessions, create_sync_engine, parse_database_url
from diagnoser.store.kept_lines import KeptLineStore, write
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import JobCompressionRow, KeptLineRow
from diagnoser.templates.compressor import CompressorConfig, KeptLine
from diagnoser.templates.stage import CompressionStage, JobFlush, StoredBounds
from tests.templates.corpus import RULES_DIR

FAILURE = "RuntimeError: CUDA error: an illegal memory access was encountered"
BOUNDS = StoredBounds(first_n=5, last_n=5, guarded_cap=3, novel_cap=0)
KEEP_ALL = CompressorConfig(min_count=10**9, min_count_numeric=10**9)
"""No filter is ever learned: every line is kept, so the bound alone decides what stays."""


_next_line: dict[tuple[int, str], int] = {}
"""(pipeline id, stream) -> the stream's next line number."""


def replica(sessions: Sessions) -> tuple[CompressionStage, Pipeline, KeptLineStore]:
    stage = CompressionStage(RuleRegistry(RULES_DIR), KEEP_ALL, bounds=BOUNDS)
    pipeline = Pipeline([stage])
    for key in [k for k in _next_line if k[0] == id(pipeline)]:
        del _next_line[key]  # a new pipeline's streams start at line 1
    return stage, pipeline, KeptLineStore(sessions, stage)


def feed(pipeline: Pipeline, stream: str, lines: list[str]) -> None:
    """One batch of the stream, numbered on from its last one, as the ingest writer frames it."""
    key = StreamKey(job_id="job-1", stream=stream, node="node-1", rank=None)
    first = _next_line.get((id(pipeline), stream), 1)
    _next_line[id(pipeline), stream] = first + len(lines)
    pipeline.process(key, make_batch(lines, first_line_no=first))


def lines(start: int, n: int) -> list[str]:
    return [f"worker {i} finished shard {i * 7} of the epoch" for i in range(start, start + n)]


async def stored(sessions: Sessions) -> list[tuple[str, str, str]]:
    async with sessions() as session:
        rows = await session.scalars(
            select(KeptLineRow).order_by(KeptLineRow.line_no, KeptLineRow.id)
        )
        return [(r.stream, r.kind, r.text) for r in rows]


async def test_the_database_keeps_the_first_and_last_lines_and_every_failure(
    sessions: Sessions,
) -> None:
    stage, pipeline, store = replica(sessions)
    failures = [f"{FAILURE} on device {d}" for d in range(5)]
    feed(pipeline, "a", [*lines(0, 20), *failures, *lines(20, 20)])
    await store.flush()
    feed(pipeline, "a", lines(40, 40))
    feed(pipeline, "b", lines(100, 8))
    await store.flush()

    rows = await stored(sessions)
    a = [(kind, line) for stream, kind, line in rows if stream == "a"]
    assert [line for kind, line in a if kind == "first"] == lines(0, 5)
    assert [line for kind, line in a if kind == "guarded"] == failures[:3]
    assert [line for kind, line in a if kind == "last"] == lines(75, 5)  # the middle: pruned
    b = [(kind, line) for stream, kind, line in rows if stream == "b"]
    assert [line for _, line in b] == lines(100, 8)  # under its stream's bound: all of it

    # Another replica (nothing in memory) reads the same log and counts.
    _, _, other = replica(sessions)
    found = await other.read("job-1", limit=1000)
    assert found is not None
    assert found.counts.lines_in == found.counts.lines_kept == 93
    assert found.counts.truncated
    texts = [e.text for e in found.log.entries(found.templates) if isinstance(e, KeptLine)]
    assert texts == [line for _, _, line in rows]
    assert stage.drain() == []


async def test_a_failed_flush_loses_nothing(sessions: Sessions) -> None:
    _, pipeline, store = replica(sessions)
    feed(pipeline, "a", [*lines(0, 3), FAILURE])
    async with sessions.begin() as session:
        await session.execute(text("ALTER TABLE kept_lines RENAME TO kept_lines_away"))
    with pytest.raises(DBAPIError):
        await store.flush()
    async with sessions.begin() as session:
        await session.execute(text("ALTER TABLE kept_lines_away RENAME TO kept_lines"))
    feed(pipeline, "a", lines(3, 2))
    await store.flush()
    assert [line for _, _, line in await stored(sessions)] == [*lines(0, 3), FAILURE, *lines(3, 2)]
    counts = await store.counts("job-1")
    assert counts is not None
    assert (counts.lines_in, counts.lines_kept, counts.lines_filtered) == (6, 6, 0)


def test_two_replicas_flushing_one_job_at_once_add_up(database_url: str) -> None:
    """The first flush of a job on two replicas used to race into a duplicate key (seen in
    bench/load.py with two replicas); the second writer now waits for the first's row."""
    db = parse_database_url(database_url)
    upgrade(db)
    engine = create_sync_engine(db)

    def flush(lines_in: int, template: str) -> JobFlush:
        return JobFlush(
            job_id="shared", family="llama", entries=[], lines_in=lines_in, lines_kept=1,
            filtered={}, filtered_by_text={template: lines_in - 1}, open_runs=[], pruned=False,
        )  # fmt: skip

    first_wrote = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        first_wrote.wait(30)
        try:
            with engine.begin() as conn:
                write(conn, [flush(20, "b <*>")], last_n=10)
        except BaseException as exc:
            errors.append(exc)

    other = threading.Thread(target=second)
    other.start()
    with engine.begin() as conn:
        write(conn, [flush(10, "a <*>")], last_n=10)
        first_wrote.set()
        other.join(0.5)  # on PostgreSQL the second waits for this row lock; on SQLite for the file
    other.join(30)
    assert errors == []
    with engine.connect() as conn:
        row = conn.execute(select(JobCompressionRow).where(JobCompressionRow.job_id == "shared"))
        counts = row.one()
    engine.dispose()
    assert (counts.lines_in, counts.lines_kept, counts.lines_filtered) == (30, 2, 28)
    assert counts.filtered_by_template == {"a <*>": 9, "b <*>": 19}
