"""A job's compressed log in the database, so that every replica serves `/log` and the counts.

The compression stage tags each kept line and closed run (`first`, `guarded`, `novel`, `last`,
`run`, see `KeptLineRow`) and hands them over with count deltas (`CompressionStage.drain`).
`KeptLineStore.flush` writes them in one transaction, off the ingest path (every few seconds,
and for one job before a route reads it here), adds the deltas to `job_compression` (replicas
add up), and prunes the middle: per stream only the newest `last_n` `last` lines stay, with the
runs between them; `first`, `guarded` and `novel` rows are never pruned. A failed flush puts
its rows back for the next one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from sqlalchemy import Connection, Table, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from diagnoser.store.database import Sessions
from diagnoser.store.models import JobCompressionRow, KeptLineRow, utcnow
from diagnoser.templates.compressor import JobLog, KeptLine, Run
from diagnoser.templates.guard import GuardReason
from diagnoser.templates.stage import CompressionStage, JobFlush

log = logging.getLogger(__name__)

PRUNABLE = ("last", "run")
COUNTS: Table = JobCompressionRow.__table__  # type: ignore[assignment]
LINES: Table = KeptLineRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class StoredLog:
    """What the database holds of one job's compressed log."""

    counts: JobCompressionRow
    log: JobLog
    templates: dict[int, str]
    """Template texts of the stored guarded lines (storm labels)."""
    open_runs: list[Run]


class KeptLineStore:
    """Writes the compression stage's kept lines and counts; reads them back for the routes."""

    def __init__(self, sessions: Sessions, stage: CompressionStage) -> None:
        self.sessions = sessions
        self.stage = stage
        self._lock = anyio.Lock()

    async def watch(self, interval_s: float) -> None:
        """Flush every `interval_s` until cancelled (then once more, at shutdown: what this
        replica compressed outlives it); a failed pass is logged and retried."""
        try:
            while True:
                await anyio.sleep(interval_s)
                try:
                    await self.flush()
                except Exception:
                    log.exception("kept-line flush failed; retrying in %.1fs", interval_s)
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def close(self) -> None:
        """The last flush, at shutdown: what this replica compressed outlives it."""
        try:
            await self.flush()
        except Exception:
            log.exception("the last kept-line flush failed; those lines are lost")

    async def flush(self, only: str | None = None) -> None:
        """Write what the stage compressed since the last flush (every job, or one)."""
        async with self._lock:
            flushes = sorted(self.stage.drain(only), key=lambda f: f.job_id)
            last_n = self.stage.bounds.last_n
            # One transaction per job: a job's rows and counts stay together, and the stream
            # commits of open uploads, which share the single SQLite writer, wait for one
            # job's flush at most, not for every job's (hundreds of statements).
            for done, flush in enumerate(flushes):
                try:
                    await self.sessions.run(
                        functools.partial(write, flushes=[flush], last_n=last_n)
                    )
                except BaseException:
                    self.stage.restore(flushes[done:])
                    raise

    async def read(self, job_id: str, limit: int) -> StoredLog | None:
        """The job's stored log (None: no replica compressed it), after this replica's flush."""
        if job_id in self.stage.jobs:
            await self.flush(job_id)
        async with self.sessions() as session:
            counts = await session.get(JobCompressionRow, job_id)
            if counts is None:
                return None
            rows = list(
                await session.scalars(
                    select(KeptLineRow)
                    .where(KeptLineRow.job_id == job_id)
                    .order_by(KeptLineRow.line_no, KeptLineRow.id)
                    .limit(limit + self.stage.bounds.guarded_cap)  # a storm's lines make one entry
                )
            )
        return _stored(counts, rows)

    async def counts(self, job_id: str) -> JobCompressionRow | None:
        """The job's counts, added up over every replica (after this replica's flush)."""
        if job_id in self.stage.jobs:
            await self.flush(job_id)
        async with self.sessions() as session:
            return await session.get(JobCompressionRow, job_id)


def _stored(counts: JobCompressionRow, rows: Sequence[KeptLineRow]) -> StoredLog:
    out = JobLog()
    templates: dict[int, str] = {}
    for row in rows:
        if row.kind == "run":
            out._order.append((1, len(out.runs)))
            out.runs.append(Run(row.template_id, row.text, row.count, row.line_no))
            continue
        reason = GuardReason(row.guarded) if row.guarded is not None else None
        if row.template is not None:
            templates[row.template_id] = row.template
        out._order.append((0, len(out.kept)))
        kept = KeptLine(row.line_no, row.text, row.template_id, reason, row.rank, row.node)
        out.kept.append(kept)
    open_runs = [
        Run(int(r["template_id"]), str(r["template"]), int(r["count"]), int(r["first_line"]))
        for r in counts.open_runs
    ]
    return StoredLog(counts, out, templates, open_runs)


def write(conn: Connection, flushes: Sequence[JobFlush], last_n: int) -> None:
    """One transaction: count deltas, new rows, and the pruned middle of the streams written."""
    table = COUNTS
    upsert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    # In job order: two replicas flushing the same jobs lock their counts rows in one order,
    # so they wait for each other instead of deadlocking (seen at 1,000 nodes on two replicas).
    for f in sorted(flushes, key=lambda f: f.job_id):
        # Replicas flush one job's counts at once: the row is created once (a plain insert
        # raced into a duplicate key), then locked while its deltas are added (the template
        # counts are merged in Python, which two unlocked writers would lose).
        conn.execute(
            upsert(table)
            .values(job_id=f.job_id, family=f.family, updated_at=utcnow())
            .on_conflict_do_nothing(index_elements=["job_id"])
        )
        row = conn.execute(
            select(JobCompressionRow.filtered_by_template, JobCompressionRow.truncated)
            .where(JobCompressionRow.job_id == f.job_id)
            .with_for_update()
        ).one()
        streams = {e.stream for e in f.entries if e.kind in PRUNABLE}
        pruned = f.pruned
        if f.entries:
            conn.execute(
                insert(LINES),
                [
                    {
                        "job_id": f.job_id,
                        "stream": e.stream,
                        "node": e.node,
                        "rank": e.rank,
                        "line_no": e.line_no,
                        "kind": e.kind,
                        "count": e.count,
                        "text": e.text,
                        "template_id": e.template_id,
                        "template": e.template,
                        "guarded": e.guarded,
                    }
                    for e in f.entries
                ],
            )
        for stream in sorted(streams):
            pruned = _prune_stream(conn, f, stream, last_n) or pruned
        merged = dict(row.filtered_by_template or {})
        for text, n in f.filtered_by_text.items():
            merged[text] = merged.get(text, 0) + n
        conn.execute(
            update(table)
            .where(table.c.job_id == f.job_id)
            .values(
                family=f.family,
                lines_in=table.c.lines_in + f.lines_in,
                lines_kept=table.c.lines_kept + f.lines_kept,
                lines_filtered=table.c.lines_filtered + (f.lines_in - f.lines_kept),
                truncated=bool(row.truncated) or pruned,
                open_runs=f.open_runs,
                filtered_by_template=merged,
                updated_at=utcnow(),
            )
        )


def _prune_stream(conn: Connection, f: JobFlush, stream: str, last_n: int) -> bool:
    """Delete the stream's `last` lines and runs older than its newest `last_n` `last` lines
    (and newer than its `first` ones); whether anything went."""
    t = LINES
    mine = (t.c.job_id == f.job_id) & (t.c.stream == stream)
    cutoff = conn.execute(
        select(t.c.line_no)
        .where(mine, t.c.kind == "last")
        .order_by(t.c.line_no.desc())
        .offset(last_n)
        .limit(1)
    ).scalar()
    if cutoff is None:
        return False
    head = conn.execute(select(func.max(t.c.line_no)).where(mine, t.c.kind == "first")).scalar()
    gone = conn.execute(
        delete(t).where(
            mine, t.c.kind.in_(PRUNABLE), t.c.line_no <= cutoff, t.c.line_no > (head or 0)
        )
    )
    return bool(gone.rowcount)
