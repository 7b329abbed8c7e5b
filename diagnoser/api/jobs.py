"""Jobs: metadata, lifecycle events, and what ingest has received from each."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import and_, or_, select

from diagnoser.api.deps import CursorQuery, JobId, ResourcesDep
from diagnoser.api.errors import ApiError, responses
from diagnoser.auth.roles import PrincipalDep
from diagnoser.diagnosis.hang import LifecycleEvent
from diagnoser.ingest.events import signal_name
from diagnoser.ingest.records import parse_time
from diagnoser.ingest.schemas import (
    CompressionCounts,
    JobDetail,
    JobEventIn,
    JobEventOut,
    JobEventType,
    JobMetadata,
    JobPage,
    JobSummary,
    StreamStatus,
)
from diagnoser.ingest.streams import ensure_job
from diagnoser.store.cursor import CursorError, decode_cursor, encode_cursor
from diagnoser.store.models import JobEventRow, JobRow, LogStreamRow, utcnow

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("", response_model=JobPage)
async def list_jobs(
    resources: ResourcesDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
) -> JobPage:
    """Jobs by most recent activity first."""
    query = select(JobRow).order_by(JobRow.last_activity_at.desc(), JobRow.id.desc())
    if cursor:
        try:
            at, job_id = decode_cursor(cursor)
        except CursorError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from exc
        query = query.where(
            or_(
                JobRow.last_activity_at < at,
                and_(JobRow.last_activity_at == at, JobRow.id < job_id),
            )
        )
    async with resources.sessions() as session:
        jobs = list(await session.scalars(query.limit(limit + 1)))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobPage(
        jobs=[JobSummary.model_validate(job) for job in jobs],
        next_cursor=encode_cursor(jobs[-1].last_activity_at, jobs[-1].id) if more else None,
    )


@router.get("/{job_id}", response_model=JobDetail, responses=responses(404))
async def get_job(job_id: JobId, resources: ResourcesDep) -> JobDetail:
    async with resources.sessions() as session:
        job = await session.get(JobRow, job_id)
        if job is None:
            raise ApiError(404, "not_found", f"no job {job_id!r}")
        streams = list(
            await session.scalars(
                select(LogStreamRow)
                .where(LogStreamRow.job_id == job_id)
                .order_by(LogStreamRow.stream)
            )
        )
        exits = list(
            await session.scalars(
                select(JobEventRow)
                .where(JobEventRow.job_id == job_id, JobEventRow.type == JobEventType.EXITED)
                .order_by(JobEventRow.ts)
            )
        )
    counts = await resources.kept_lines.counts(job_id)  # every replica's, from the database
    return JobDetail(
        **JobSummary.model_validate(job).model_dump(),
        compression=None
        if counts is None
        else CompressionCounts(
            lines_in=counts.lines_in,
            lines_kept=counts.lines_kept,
            lines_filtered=counts.lines_filtered,
            ratio=counts.lines_kept / counts.lines_in if counts.lines_in else 0.0,
        ),
        nodes=sorted({s.node for s in streams}),
        ranks=sorted({s.rank for s in streams if s.rank is not None}),
        streams=[StreamStatus.model_validate(s) for s in streams],
        exits=[JobEventOut.model_validate(e) for e in exits],
    )


@router.put("/{job_id}", response_model=JobSummary, responses=responses(400))
async def put_job(job_id: JobId, metadata: JobMetadata, resources: ResourcesDep) -> JobSummary:
    """Create the job or set its metadata (family, framework, Kubernetes namespace/kind/name)."""
    values = metadata.model_dump(exclude_none=True)
    await resources.sessions.run(lambda conn: ensure_job(conn, job_id, {}))
    async with resources.sessions.begin() as session:
        job = await session.get(JobRow, job_id)
        assert job is not None
        for key, value in values.items():
            setattr(job, key, value)
        await session.flush()
        summary = JobSummary.model_validate(job)
    # Before the job's first line: its family's stored filters compress it from the start.
    await resources.filters.prepare(job_id, summary.family)
    return summary


@router.post(
    "/{job_id}/events", response_model=JobEventOut, status_code=201, responses=responses(400)
)
async def post_event(
    job_id: JobId, event: JobEventIn, resources: ResourcesDep, principal: PrincipalDep
) -> JobEventRow:
    """Lifecycle: `started`, `heartbeat`, `exited` (exit codes and signals are evidence)."""
    if problem := principal.binding.node_problem(event.node):
        raise ApiError(403, "forbidden", problem)
    if principal.binding.node is not None:
        event = event.model_copy(update={"node": principal.binding.node})
    if isinstance(event.ts, datetime):
        ts = event.ts if event.ts.tzinfo else event.ts.replace(tzinfo=UTC)
    elif event.ts is not None and (epoch := parse_time(event.ts)) is not None:
        ts = datetime.fromtimestamp(epoch, UTC)
    else:
        ts = utcnow()
    await resources.sessions.run(lambda conn: ensure_job(conn, job_id, {}))
    signal = signal_name(event.exit_code, event.signal)
    # Told first: a restart settles the old attempt against the events stored before this one.
    await resources.flow.lifecycle(
        job_id, LifecycleEvent(event.type.value, event.node, time.time(), event.exit_code, signal)
    )
    async with resources.sessions.begin() as session:
        job = await session.get(JobRow, job_id)
        assert job is not None
        job.last_activity_at = utcnow()
        row = JobEventRow(
            job_id=job_id,
            type=event.type.value,
            node=event.node,
            rank=event.rank,
            exit_code=event.exit_code,
            signal=signal,
            ts=ts,
        )
        session.add(row)
        await session.flush()
        await session.refresh(row)
    return row
