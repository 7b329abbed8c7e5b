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
from collections.abc import Callable
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
    JobActivityRow,
    JobCompressionRow,
    JobEventRow,
    JobOwnerRow,
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
OWNERS: Table = JobOwnerRow.__table__  # type: ignore[assignment]
ACTIVITY: Table = JobActivityRow.__table__  # type: ignore[assignment]
DIAGNOSES: Table = DiagnosisRow.__table__  # type: ignore[assignment]
CULPRITS: Table = DiagnosisCulpritRow.__table__  # type: ignore[assignment]
FEEDBACK: Table = FeedbackRow.__table__  # type: ignore[assignment]
ESCALATIONS: Table = EscalationRow.__table__  # type: ignore[assignment]
ACTIONS: Table = ActionRow.__table__  # type: ignore[assignment]

LINE_TABLES = (KEPT_LINES, EVENTS, STREAMS)
"""A job's rows with an integer id, deleted in chunks of `batch_size`."""
PER_JOB_TABLES = (COMPRESSION, OWNERS, ACTIVITY)
"""A few rows per job (counts, the replicas' lease and activity), deleted in one statement."""
DIAGNOSIS_CHILDREN = (CULPRITS, FEEDBACK, ESCALATIONS, ACTIONS)
"""Deleted before their diagnosis (foreign-key order; no reliance on ON DELETE CASCADE)."""
TABLES = tuple(
    t.name for t in (*LINE_TABLES, *PER_JOB_TABLES, *DIAGNOSIS_CHILDREN, DIAGNOSES, JOBS)
)
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


@dataclass(frozen=True, slots=True)
class JobRange:
    """One step's jobs: from `first` to `last` in (last activity, id) order, both included.

    A range rather than a list of ids: every statement selects its jobs by the index on
    `last_activity_at`, with no thousand bound parameters to render and send."""

    first: tuple[datetime, str]
    last: tuple[datetime, str]


def _idle(jobs: JobRange, cutoff: datetime) -> Select[tuple[str]]:
    """The jobs of the range that are still idle (one may have come back since)."""
    (first_at, first_id), (last_at, last_id) = jobs.first, jobs.last
    at, job_id = JOBS.c.last_activity_at, JOBS.c.id
    return select(job_id).where(
        at < cutoff,
        (at > first_at) | ((at == first_at) & (job_id >= first_id)),
        (at < last_at) | ((at == last_at) & (job_id <= last_id)),
    )


def _locked(conn: Connection, query: Select[tuple[T]]) -> Select[tuple[T]]:
    """The query, locking its rows against concurrent writers on PostgreSQL (SQLite has one
    writer at a time anyway)."""
    if conn.dialect.name == "postgresql":
        return query.with_for_update(skip_locked=True)
    return query


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
    conn: Connection, table: Table, jobs: JobRange, cutoff: datetime, limit: int
) -> int:
    """Up to `limit` rows of `table` that belong to jobs of the range still idle."""
    idle = _locked(conn, _idle(jobs, cutoff))
    chosen = _locked(conn, select(table.c.id).where(table.c.job_id.in_(idle)).limit(limit))
    return conn.execute(delete(table).where(table.c.id.in_(chosen))).rowcount


def delete_per_job(conn: Connection, table: Table, jobs: JobRange, cutoff: datetime) -> int:
    """`table`'s rows of the jobs of the range still idle (a few rows per job, no id)."""
    idle = _locked(conn, _idle(jobs, cutoff))
    return conn.execute(delete(table).where(table.c.job_id.in_(idle))).rowcount


def _prunable_diagnoses(jobs: JobRange, cutoffs: Cutoffs, limit: int) -> Select[tuple[str]]:
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
            d.c.job_id.in_(_idle(jobs, cutoffs.lines)),
            d.c.updated_at < cutoffs.diagnoses,
            ~in_flight,
            ~escalating,
        )
        .order_by(d.c.updated_at, d.c.id)
        .limit(limit)
    )


def delete_diagnoses(
    conn: Connection, jobs: JobRange, cutoffs: Cutoffs, limit: int
) -> Counter[str]:
    """Up to `limit` diagnoses of the range's jobs still idle, each with its children, in one
    transaction (a diagnosis never loses its actions and stays)."""
    chosen = list(conn.scalars(_locked(conn, _prunable_diagnoses(jobs, cutoffs, limit))))
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


def delete_jobs(conn: Connection, jobs: JobRange, cutoff: datetime) -> int:
    """The jobs of the range still idle that nothing refers to any more."""
    unreferenced = _idle(jobs, cutoff).where(
        ~exists().where(DIAGNOSES.c.job_id == JOBS.c.id),
        ~exists().where(STREAMS.c.job_id == JOBS.c.id),
        ~exists().where(EVENTS.c.job_id == JOBS.c.id),
    )
    return conn.execute(delete(JOBS).where(JOBS.c.id.in_(_locked(conn, unreferenced)))).rowcount


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
            await self._prune_jobs(report, JobRange(jobs[0], jobs[-1]), cutoffs)
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

    async def _prune_jobs(self, report: PruneReport, jobs: JobRange, cutoffs: Cutoffs) -> None:
        limit = self.settings.batch_size
        for table in LINE_TABLES:
            step = functools.partial(
                delete_job_rows, table=table, jobs=jobs, cutoff=cutoffs.lines, limit=limit
            )
            while (gone := await self._step(report, step)) > 0:
                self._count(report, Counter({table.name: gone}))
                if gone < limit:
                    break
        for table in PER_JOB_TABLES:
            per_job = functools.partial(
                delete_per_job, table=table, jobs=jobs, cutoff=cutoffs.lines
            )
            self._count(report, Counter({table.name: await self._step(report, per_job)}))
        if cutoffs.diagnoses is not None:
            diagnoses = functools.partial(delete_diagnoses, jobs=jobs, cutoffs=cutoffs, limit=limit)
            while counts := await self._step(report, diagnoses):
                self._count(report, counts)
                if counts[DIAGNOSES.name] < limit:
                    break
        rows = functools.partial(delete_jobs, jobs=jobs, cutoff=cutoffs.lines)
        self._count(report, Counter({JOBS.name: await self._step(report, rows)}))

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
