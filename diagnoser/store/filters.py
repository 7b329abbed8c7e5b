"""Learned filters in the database: what one replica learns, every replica and later job uses.

`FilterStore.sync` runs every few seconds, off the ingest path: it writes the filters a
family's compressor learned since the last pass (and hit counts, and the ones the guard
disabled), applies what changed in the database (a `PATCH /v1/filters/{id}`, another replica's
disable), and hands each family's compressor the stored filters it does not have yet, so a new
job of a known family is compressed from its first batches. Rows are plain columns and JSON.

A filter that changed here and in the database since the last pass keeps the local state: the
guard disabling a filter on a failure line must never be undone by a stale row.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.store.database import Sessions
from diagnoser.store.models import FilterRow, utcnow
from diagnoser.templates.compressor import Compressor, JobCompression, validate_promotion
from diagnoser.templates.filters import Filter, Proposer
from diagnoser.templates.stage import CompressionStage

log = logging.getLogger(__name__)

DISABLED_BY_API = "disabled through the API"


class Scope(StrEnum):
    GLOBAL = "global"
    FAMILY = "family"
    JOB = "job"


@dataclass(slots=True)
class _Synced:
    """What the database held for one local filter after the last pass."""

    row_id: int
    enabled: bool
    hits: int


@dataclass(slots=True)
class _FamilyState:
    compressor: Compressor
    by_filter: dict[int, _Synced] = field(default_factory=dict)
    """Local filter id -> its row."""
    by_row: dict[int, Filter] = field(default_factory=dict)


@dataclass(slots=True)
class _JobState:
    """The `job`-scope rows of one job being compressed here, and what they held last pass."""

    job: JobCompression
    by_row: dict[int, Filter] = field(default_factory=dict)
    synced: dict[int, _Synced] = field(default_factory=dict)


JOB_IDS_PER_QUERY = 500


class FilterStore:
    """Keeps the compression stage's filters and the `filters` table in step."""

    def __init__(self, sessions: Sessions, stage: CompressionStage) -> None:
        self.sessions = sessions
        self.stage = stage
        self._families: dict[str, _FamilyState] = {}
        self._jobs: dict[str, _JobState] = {}
        self._lock = anyio.Lock()

    async def watch(self, interval_s: float) -> None:
        """Sync every `interval_s` until cancelled; a failed pass is logged and retried."""
        while True:
            await anyio.sleep(interval_s)
            try:
                await self.sync()
            except Exception:
                log.exception("filter sync failed; retrying in %.1fs", interval_s)

    async def prepare(self, job_id: str, family: str | None) -> None:
        """Before a job's first line: name its family, load the family's stored filters and
        the job's own (`job` scope), promote what earlier jobs of the family taught. Nothing to
        do (no database work) once the job is being compressed here."""
        if job_id in self.stage.jobs:
            return
        if family:
            self.stage.set_family(job_id, family)
        name = self.stage.family(job_id)
        known = name in self.stage.families
        self.stage.open(job_id)
        if known:
            await self.promote(name)
        await self.sync([name])

    async def promote(self, family: str) -> int:
        """A new job of a known family: the templates its earlier jobs left unfiltered become
        filters, validated in a thread against a snapshot (the ingest loop never waits)."""
        compressor = self.stage.families.get(family)
        if compressor is None or not compressor.config.promote:
            return 0
        work, snapshot = compressor.promotion()
        if not work:
            return 0
        found, rejected = await anyio.to_thread.run_sync(validate_promotion, work, snapshot)
        return compressor.finish_promotion(found, snapshot, rejected)

    async def sync(self, only: Sequence[str] | None = None) -> None:
        while self.stage.to_promote:
            await self.promote(self.stage.to_promote.pop())
        async with self._lock:
            names = list(only) if only is not None else list(self.stage.families)
            for stale in set(self._families) - set(self.stage.families):
                del self._families[stale]
            async with self.sessions.begin() as session:
                for name in names:
                    compressor = self.stage.families.get(name)
                    if compressor is not None:
                        await self._sync_family(session, name, compressor)
                await self._sync_jobs(session, None if only is None else set(names))

    async def _sync_jobs(self, session: AsyncSession, families: set[str] | None) -> None:
        """`job`-scope rows: each applies to its own job only (its `JobCompression.filters`)."""
        for stale in set(self._jobs) - set(self.stage.jobs):
            del self._jobs[stale]
        job_ids = [
            j for j in self.stage.jobs if families is None or self.stage.family(j) in families
        ]
        now = utcnow()
        for start in range(0, len(job_ids), JOB_IDS_PER_QUERY):
            chunk = job_ids[start : start + JOB_IDS_PER_QUERY]
            rows = await session.scalars(
                select(FilterRow).where(FilterRow.scope == Scope.JOB, FilterRow.job_id.in_(chunk))
            )
            for row in rows:
                job = self.stage.jobs.get(row.job_id or "")
                if job is None:
                    continue
                state = self._jobs.get(row.job_id or "")
                if state is None or state.job is not job:
                    state = self._jobs[row.job_id or ""] = _JobState(job)
                f = state.by_row.get(row.id)
                if f is None:
                    f = state.by_row[row.id] = job.job_filters().adopt(_filter_of(row))
                    state.synced[row.id] = _Synced(row.id, f.enabled, 0)
                    continue
                known = state.synced[row.id]
                own = job.job_filters()
                if f.enabled != known.enabled:  # changed here (the guard): the row follows
                    if f.enabled:
                        row.enabled, row.disabled_reason = True, None
                        row.version += 1
                    else:
                        _disable_row(row, f.disabled_reason)
                elif row.enabled != f.enabled:  # changed in the database: this job follows
                    if row.enabled:
                        own.enable(f)
                    else:
                        own.disable(f, 0, "", row.disabled_reason or DISABLED_BY_API)
                if f.hits > known.hits:
                    row.hits += f.hits - known.hits
                    row.last_hit_at = now
                known.enabled, known.hits = f.enabled, f.hits

    def _state(self, family: str, compressor: Compressor) -> _FamilyState:
        state = self._families.get(family)
        if state is None or state.compressor is not compressor:
            state = self._families[family] = _FamilyState(compressor)
        return state

    async def _sync_family(self, session: AsyncSession, family: str, c: Compressor) -> None:
        state = self._state(family, c)
        rows = {
            row.id: row
            for row in await session.scalars(
                select(FilterRow).where(
                    or_(
                        FilterRow.scope == Scope.GLOBAL,
                        (FilterRow.scope == Scope.FAMILY) & (FilterRow.family == family),
                    )
                )
            )
        }
        by_pattern = {row.pattern: row for row in rows.values() if row.scope == Scope.FAMILY}
        now = utcnow()
        for f in list(c.filters.filters):
            known = state.by_filter.get(f.id)
            if known is None:
                row = by_pattern.get(f.pattern)
                if row is None:
                    row = _row_of(f, family)
                    session.add(row)
                    await session.flush()
                    rows[row.id] = row
                    by_pattern[row.pattern] = row
                elif row.enabled and not f.enabled:
                    _disable_row(row, f.disabled_reason)
                known = state.by_filter[f.id] = _Synced(row.id, row.enabled, 0)
                state.by_row[row.id] = f
                if f.enabled and not row.enabled:
                    c.filters.disable(f, 0, "", row.disabled_reason or DISABLED_BY_API)
            else:
                found = rows.get(known.row_id)
                if found is None:
                    continue
                row = found
                if f.enabled != known.enabled:
                    if f.enabled:
                        row.enabled, row.disabled_reason = True, None
                        row.version += 1
                    else:
                        _disable_row(row, f.disabled_reason)
                elif row.enabled != f.enabled:
                    _apply(c, f, row)
            if f.hits > known.hits:
                row.hits += f.hits - known.hits
                row.last_hit_at = now
            known.enabled, known.hits = f.enabled, f.hits
        for row_id, row in rows.items():
            if row_id in state.by_row:
                continue
            adopted = c.filters.adopt(_filter_of(row))
            state.by_row[row_id] = adopted
            state.by_filter[adopted.id] = _Synced(row_id, adopted.enabled, 0)

    async def set_enabled(self, row_id: int, enabled: bool) -> None:
        """A person's decision on one filter, applied here at once (other replicas next pass)."""
        async with self._lock:
            for state in self._families.values():
                f = state.by_row.get(row_id)
                if f is not None and f.enabled != enabled:
                    if enabled:
                        state.compressor.filters.enable(f)
                    else:
                        state.compressor.filters.disable(f, 0, "", DISABLED_BY_API)
                    state.by_filter[f.id].enabled = f.enabled
            for job_state in self._jobs.values():
                f = job_state.by_row.get(row_id)
                if f is not None and f.enabled != enabled:
                    own = job_state.job.job_filters()
                    if enabled:
                        own.enable(f)
                    else:
                        own.disable(f, 0, "", DISABLED_BY_API)
                    job_state.synced[row_id].enabled = f.enabled


def _apply(c: Compressor, f: Filter, row: FilterRow) -> None:
    if row.enabled:
        c.filters.enable(f)
    else:
        c.filters.disable(f, 0, "", row.disabled_reason or DISABLED_BY_API)


def _disable_row(row: FilterRow, reason: str | None) -> None:
    row.enabled = False
    row.disabled_reason = reason
    row.version += 1


def _row_of(f: Filter, family: str) -> FilterRow:
    return FilterRow(
        scope=Scope.FAMILY.value,
        family=family,
        job_id=None,
        template=f.template,
        pattern=f.pattern,
        proposer=f.proposer.value,
        names=list(f.names),
        hits=0,
        enabled=f.enabled,
        disabled_reason=f.disabled_reason,
        version=f.version,
    )


def _filter_of(row: FilterRow) -> Filter:
    """A stored filter as the matcher's; its template id is below every miner's (no mixing)."""
    return Filter(
        id=0,
        template_id=-row.id,
        template=row.template,
        pattern=row.pattern,
        proposer=Proposer(row.proposer),
        enabled=row.enabled,
        disabled_reason=row.disabled_reason,
        version=row.version,
        names=tuple(row.names),
    )
