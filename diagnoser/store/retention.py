"""Retention: a job's data is pruned once the job has been idle longer than a configured age.

The unit is the job, aged by `jobs.last_activity_at` (moved by every committed line and
lifecycle event), so a job still streaming is never touched. For a job idle past
`retention.days`, its kept lines, events, stream rows and compression counts go. Its
diagnoses (with their culprits, feedback, escalations and actions) go once not updated for
`retention.diagnosis_days`, unless one of their actions is still in flight (pending or claimed)
or an escalation is pending. The job row itself goes last, once nothing refers to it.

Every delete is its own small transaction of at most `batch_size` rows, re-checking in its own
statement that the job is still idle; on SQLite each one queues on the single writer beside
ingest's commits, with a pause between them. On PostgreSQL the job and diagnosis rows are
locked `FOR UPDATE SKIP LOCKED` first: two replicas pruning at once skip each other's rows,
and an ingest commit racing a delete of its own job either waits for it or is skipped.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import anyio
from sqlalchemy import Connection, Select, Table, delete, exists, select

from diagnoser.actions.kinds import FINAL_STATES
from diagnoser.config import RetentionSettings
from diagnoser.store.database import Sessions
from diagnoser.store.models import (
    ActionRow,
    DiagnosisCulpritRow,
    DiagnosisRow,
    EscalationRow,
    FeedbackRow,
    JobCompressionRow,
    JobEventRow,
    JobRow,
    KeptLineRow,
    LogStreamRow,
    utcnow,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

JOBS: Table = JobRow.__table__  # type: ignore[assignment]
KEPT_LINES: Table = KeptLineRow.__table__  # type: ignore[assignment]
EVENTS: Table = JobEventRow.__table__  # type: ignore[assignment]
STREAMS: Table = LogStreamRow.__table__  # type: ignore[assignment]
COMPRESSION: Table = JobCompressionRow.__table__  # type: ignore[assignment]
DIAGNOSES: Table = DiagnosisRow.__table__  # type: ignore[assignment]
CULPRITS: Table = DiagnosisCulpritRow.__table__  # type: ignore[assignment]
FEEDBACK: Table = FeedbackRow.__table__  # type: ignore[assignment]
ESCALATIONS: Table = EscalationRow.__table__  # type: ignore[assignment]
ACTIONS: Table = ActionRow.__table__  # type: ignore[assignment]

LINE_TABLES = (KEPT_LINES, EVENTS, STREAMS)
"""A job's rows with an integer id, deleted in chunks of `batch_size`."""
DIAGNOSIS_CHILDREN = (CULPRITS, FEEDBACK, ESCALATIONS, ACTIONS)
"""Deleted before their diagnosis (foreign-key order; no reliance on ON DELETE CASCADE)."""
TABLES = tuple(t.name for t in (*LINE_TABLES, COMPRESSION, *DIAGNOSIS_CHILDREN, DIAGNOSES, JOBS))
"""Every table retention prunes, in the order it does."""
FINAL_ACTION_STATES = sorted(s.value for s in FINAL_STATES)
FIRST_PASS_MAX_DELAY_S = 60.0


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Jobs idle since before `lines` are pruned; their diagnoses not updated since before
    `diagnoses` too (None: diagnoses are kept forever)."""

    lines: datetime
    diagnoses: datetime | None

    @classmethod
    def at(cls, now: datetime, settings: RetentionSettings) -> Cutoffs:
        diagnoses = (
            now - timedelta(days=settings.diagnosis_days) if settings.diagnosis_days else None
        )
        return cls(now - timedelta(days=settings.days), diagnoses)


@dataclass(slots=True)
class PruneReport:
    """What one pass deleted, by table."""

    rows: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclass(slots=True)
class RetentionTotals:
    """Running totals since start, for /metrics (observability.RetentionCollector)."""

    rows: Counter[str] = field(default_factory=Counter)
    passes_ok: int = 0
    passes_failed: int = 0
    last_success: float | None = None
    """Unix time of the last pass that completed."""


def _idle(ids: Sequence[str], cutoff: datetime) -> Select[tuple[str]]:
    return select(JOBS.c.id).where(JOBS.c.id.in_(ids), JOBS.c.last_activity_at < cutoff)


def _lock(conn: Connection, query: Select[tuple[T]]) -> list[T]:
    """The rows' keys, locked against concurrent writers on PostgreSQL (SQLite: one writer)."""
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return list(conn.scalars(query))


def next_jobs(
    conn: Connection, cutoff: datetime, after: tuple[datetime, str] | None, limit: int
) -> list[tuple[datetime, str]]:
    """The next `limit` jobs idle since before `cutoff`, in (last activity, id) order."""
    query = select(JOBS.c.last_activity_at, JOBS.c.id).where(JOBS.c.last_activity_at < cutoff)
    if after is not None:
        at, job_id = after
        query = query.where(
            (JOBS.c.last_activity_at > at)
            | ((JOBS.c.last_activity_at == at) & (JOBS.c.id > job_id))
        )
    query = query.order_by(JOBS.c.last_activity_at, JOBS.c.id).limit(limit)
    return [(row[0], row[1]) for row in conn.execute(query)]


def delete_job_rows(
    conn: Connection, table: Table, ids: Sequence[str], cutoff: datetime, limit: int
) -> int:
    """Up to `limit` rows of `table` that belong to those of `ids` still idle."""
    jobs = _lock(conn, _idle(ids, cutoff))
    if not jobs:
        return 0
    chosen = _lock(conn, select(table.c.id).where(table.c.job_id.in_(jobs)).limit(limit))
    if not chosen:
        return 0
    return conn.execute(delete(table).where(table.c.id.in_(chosen))).rowcount


def delete_compression(conn: Connection, ids: Sequence[str], cutoff: datetime) -> int:
    """The compression counts of those of `ids` still idle (one row per job)."""
    jobs = _lock(conn, _idle(ids, cutoff))
    if not jobs:
        return 0
    return conn.execute(delete(COMPRESSION).where(COMPRESSION.c.job_id.in_(jobs))).rowcount


def _prunable_diagnoses(ids: Sequence[str], cutoffs: Cutoffs, limit: int) -> Select[tuple[str]]:
    assert cutoffs.diagnoses is not None
    d = DIAGNOSES
    in_flight = exists().where(
        ACTIONS.c.diagnosis_id == d.c.id, ACTIONS.c.state.not_in(FINAL_ACTION_STATES)
    )
    escalating = exists().where(
        ESCALATIONS.c.diagnosis_id == d.c.id, ESCALATIONS.c.state == "pending"
    )
    return (
        select(d.c.id)
        .where(
            d.c.job_id.in_(_idle(ids, cutoffs.lines)),
            d.c.updated_at < cutoffs.diagnoses,
            ~in_flight,
            ~escalating,
        )
        .order_by(d.c.updated_at, d.c.id)
        .limit(limit)
    )


def delete_diagnoses(
    conn: Connection, ids: Sequence[str], cutoffs: Cutoffs, limit: int
) -> Counter[str]:
    """Up to `limit` diagnoses of those of `ids` still idle, each with its children, in one
    transaction (a diagnosis never loses its actions and stays)."""
    chosen = _lock(conn, _prunable_diagnoses(ids, cutoffs, limit))
    counts: Counter[str] = Counter()
    if not chosen:
        return counts
    for child in DIAGNOSIS_CHILDREN:
        gone = conn.execute(delete(child).where(child.c.diagnosis_id.in_(chosen))).rowcount
        counts[child.name] += gone
    counts[DIAGNOSES.name] += conn.execute(
        delete(DIAGNOSES).where(DIAGNOSES.c.id.in_(chosen))
    ).rowcount
    return counts


def delete_jobs(conn: Connection, ids: Sequence[str], cutoff: datetime) -> int:
    """Those of `ids` still idle that nothing refers to any more."""
    unreferenced = _idle(ids, cutoff).where(
        ~exists().where(DIAGNOSES.c.job_id == JOBS.c.id),
        ~exists().where(STREAMS.c.job_id == JOBS.c.id),
        ~exists().where(EVENTS.c.job_id == JOBS.c.id),
    )
    jobs = _lock(conn, unreferenced)
    if not jobs:
        return 0
    return conn.execute(delete(JOBS).where(JOBS.c.id.in_(jobs))).rowcount


class Pruner:
    """Runs passes over the database: in the service every `interval_s`, or once (the CLI)."""

    def __init__(
        self,
        sessions: Sessions,
        settings: RetentionSettings,
        totals: RetentionTotals | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.totals = totals if totals is not None else RetentionTotals()

    async def watch(self) -> None:
        """Prune every `interval_s` until cancelled; a failed pass is logged and retried."""
        await anyio.sleep(min(self.settings.interval_s, FIRST_PASS_MAX_DELAY_S))
        while True:
            try:
                await self.prune()
            except Exception:
                self.totals.passes_failed += 1
                log.exception("retention pass failed; retrying in %.0fs", self.settings.interval_s)
            await anyio.sleep(self.settings.interval_s)

    async def prune(self, now: datetime | None = None) -> PruneReport:
        """One pass over every job idle past the cutoff; logs and counts what went."""
        report = PruneReport()
        if not self.settings.enabled:
            return report
        started = time.monotonic()
        cutoffs = Cutoffs.at(now or utcnow(), self.settings)
        limit = self.settings.batch_size
        after: tuple[datetime, str] | None = None
        while jobs := await self._step(
            report, functools.partial(next_jobs, cutoff=cutoffs.lines, after=after, limit=limit)
        ):
            after = jobs[-1]
            await self._prune_jobs(report, [job_id for _, job_id in jobs], cutoffs)
        report.seconds = time.monotonic() - started
        self.totals.passes_ok += 1
        self.totals.last_success = time.time()
        if report.total:
            log.info(
                "retention pruned %d rows in %.1fs (%s)",
                report.total,
                report.seconds,
                ", ".join(f"{name} {n}" for name, n in sorted(report.rows.items()) if n),
            )
        return report

    async def _prune_jobs(self, report: PruneReport, ids: list[str], cutoffs: Cutoffs) -> None:
        limit = self.settings.batch_size
        for table in LINE_TABLES:
            step = functools.partial(
                delete_job_rows, table=table, ids=ids, cutoff=cutoffs.lines, limit=limit
            )
            while (gone := await self._step(report, step)) > 0:
                self._count(report, Counter({table.name: gone}))
                if gone < limit:
                    break
        compression = functools.partial(delete_compression, ids=ids, cutoff=cutoffs.lines)
        self._count(report, Counter({COMPRESSION.name: await self._step(report, compression)}))
        if cutoffs.diagnoses is not None:
            diagnoses = functools.partial(delete_diagnoses, ids=ids, cutoffs=cutoffs, limit=limit)
            while counts := await self._step(report, diagnoses):
                self._count(report, counts)
                if counts[DIAGNOSES.name] < limit:
                    break
        jobs = functools.partial(delete_jobs, ids=ids, cutoff=cutoffs.lines)
        self._count(report, Counter({JOBS.name: await self._step(report, jobs)}))

    def _count(self, report: PruneReport, rows: Counter[str]) -> None:
        """As each transaction commits: /metrics follows a long pass."""
        report.rows.update(rows)
        self.totals.rows.update(rows)

    async def _step(self, report: PruneReport, fn: Callable[[Connection], T]) -> T:
        """One transaction, then the pause that lets ingest's writes in."""
        result = await self.sessions.run(fn)
        report.transactions += 1
        if self.settings.pause_s:
            await anyio.sleep(self.settings.pause_s)
        return result
