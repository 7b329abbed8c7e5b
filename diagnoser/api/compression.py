"""The compressed log: a job's kept lines and filtered runs, its templates, the stored filters.

Logs and counts are the database's (`diagnoser.store.kept_lines`): every replica serves them.
Templates are the miner's of the replica compressing the job; another replica lists the
family's stored filters with the job's counts. Filters are the database's, shared by every
replica. Disabling a filter takes effect here at once and on
the other replicas at their next sync.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import or_, select

from diagnoser.api.deps import JobId, Resources, ResourcesDep
from diagnoser.api.errors import ApiError, responses
from diagnoser.auth.audit import record
from diagnoser.auth.roles import PrincipalDep
from diagnoser.ingest.schemas import MAX_NAME_LENGTH
from diagnoser.store.filters import DISABLED_BY_API, Scope
from diagnoser.store.models import FilterRow
from diagnoser.templates.compressor import CompressorConfig, KeptLine, Run
from diagnoser.templates.schemas import (
    FilterOut,
    FilterPage,
    FilterPatch,
    JobLogOut,
    KeptLineOut,
    RunOut,
    StormOut,
    TemplateOut,
    TemplatePage,
)

router = APIRouter(prefix="/v1", tags=["compression"])
STORM_MIN = CompressorConfig().storm_min

FilterId = Annotated[int, Path(ge=1, le=2**63 - 1)]
FamilyFilter = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9][\w.:@/-]*$"),
]


def _line(k: KeptLine) -> KeptLineOut:
    return KeptLineOut(
        line_no=k.line_no,
        node=k.node,
        rank=k.rank,
        text=k.text,
        template_id=k.template_id,
        guarded=None if k.guarded is None else k.guarded.value,
    )


def _run(e: Run) -> RunOut:
    return RunOut(
        count=e.count,
        first_line=e.first_line,
        template_id=e.template_id,
        template=e.template,
        text=f"[x {e.count:,} lines] {e.template}",
    )


@router.get("/jobs/{job_id}/log", response_model=JobLogOut, responses=responses(404))
async def job_log(
    job_id: JobId,
    resources: ResourcesDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> JobLogOut:
    """Kept lines interleaved with `[x N lines] <template>` runs; a storm is one entry. Read
    from the database (this replica's lines flushed first): any replica answers the same."""
    stored = await resources.kept_lines.read(job_id, limit)
    if stored is None:
        raise ApiError(404, "not_found", f"no compressed log for job {job_id!r}")
    texts = dict(stored.templates)
    compressor = resources.compression.job_compressor(job_id)
    if compressor is not None:
        texts.update({t.id: t.text for t in compressor.templates()})
    storm_min = compressor.config.storm_min if compressor is not None else STORM_MIN
    entries: list[KeptLineOut | RunOut | StormOut] = []
    for e in [*stored.log.entries(texts, storm_min), *stored.open_runs][:limit]:
        if isinstance(e, KeptLine):
            entries.append(_line(e))
        elif isinstance(e, Run):
            entries.append(_run(e))
        else:
            entries.append(
                StormOut(
                    count=e.count,
                    template_id=e.template_id,
                    template=e.template,
                    ranks=sorted(e.ranks),
                    nodes=sorted(e.nodes),
                    first=_line(e.first),
                    last=_line(e.last),
                )
            )
    counts = stored.counts
    return JobLogOut(
        job_id=job_id,
        family=counts.family,
        lines_in=counts.lines_in,
        lines_kept=counts.lines_kept,
        lines_filtered=counts.lines_filtered,
        ratio=counts.lines_kept / counts.lines_in if counts.lines_in else 0.0,
        truncated=counts.truncated,
        entries=entries,
    )


@router.get("/jobs/{job_id}/templates", response_model=TemplatePage, responses=responses(404))
async def job_templates(
    job_id: JobId,
    resources: ResourcesDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> TemplatePage:
    """The family's templates, most frequent first, then the filters it started with. On a
    replica that is not compressing the job: the stored filters it used, with its counts."""
    stage = resources.compression
    log = stage.log(job_id)
    compressor = stage.job_compressor(job_id)
    if log is None or compressor is None:
        return await _stored_templates(job_id, resources, limit)
    filters = {f.template_id: f for f in compressor.filters.filters}
    out: list[TemplateOut] = []
    for t in compressor.templates():
        f = filters.pop(t.id, None)
        out.append(
            TemplateOut(
                id=t.id,
                text=t.text,
                count=t.count,
                filtered_in_job=log.filtered_by_template.get(t.id, 0),
                filtered=f is not None and f.enabled,
                samples=list(t.samples),
            )
        )
    for f in filters.values():  # adopted from the family's stored set: no local template
        out.append(
            TemplateOut(
                id=f.template_id,
                text=f.template,
                count=0,
                filtered_in_job=log.filtered_by_template.get(f.template_id, 0),
                filtered=f.enabled,
                samples=[],
            )
        )
    return TemplatePage(job_id=job_id, family=stage.family(job_id), templates=out[:limit])


async def _stored_templates(job_id: str, resources: Resources, limit: int) -> TemplatePage:
    """The job's family's stored filters as templates (no miner here: no samples, count 0),
    with the lines each filtered in the job, as every replica reported them."""
    counts = await resources.kept_lines.counts(job_id)
    if counts is None:
        raise ApiError(404, "not_found", f"no compressed log for job {job_id!r}")
    query = select(FilterRow).where(
        or_(
            FilterRow.scope == Scope.GLOBAL,
            (FilterRow.scope == Scope.FAMILY) & (FilterRow.family == counts.family),
            (FilterRow.scope == Scope.JOB) & (FilterRow.job_id == job_id),
        )
    )
    async with resources.sessions() as session:
        rows = list(await session.scalars(query.order_by(FilterRow.id)))
    filtered = counts.filtered_by_template
    out = [
        TemplateOut(
            id=-row.id,
            text=row.template,
            count=0,
            filtered_in_job=filtered.get(row.template, 0),
            filtered=row.enabled,
            samples=[],
        )
        for row in rows
    ]
    out.sort(key=lambda t: -t.filtered_in_job)
    return TemplatePage(job_id=job_id, family=counts.family, templates=out[:limit])


@router.get("/filters", response_model=FilterPage)
async def list_filters(
    resources: ResourcesDep,
    family: FamilyFilter = None,
    enabled: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> FilterPage:
    """Stored filters, most hits first. Learned ones reach the database within seconds."""
    query = select(FilterRow).order_by(FilterRow.hits.desc(), FilterRow.id)
    if family is not None:
        query = query.where(FilterRow.family == family)
    if enabled is not None:
        query = query.where(FilterRow.enabled == enabled)
    async with resources.sessions() as session:
        rows = list(await session.scalars(query.limit(limit)))
    return FilterPage(filters=[FilterOut.model_validate(r) for r in rows])


@router.patch("/filters/{filter_id}", response_model=FilterOut, responses=responses(400, 404))
async def patch_filter(
    filter_id: FilterId, patch: FilterPatch, resources: ResourcesDep, principal: PrincipalDep
) -> FilterOut:
    """Enable or disable one filter: its lines are kept again (or dropped) from the next batch."""
    async with resources.sessions.begin() as session:
        row = await session.get(FilterRow, filter_id)
        if row is None:
            raise ApiError(404, "not_found", f"no filter {filter_id}")
        if row.enabled != patch.enabled:
            row.enabled = patch.enabled
            row.disabled_reason = None if patch.enabled else DISABLED_BY_API
            row.version += 1
        verb = "filter.enable" if patch.enabled else "filter.disable"
        record(session, principal.actor, verb, str(filter_id), {"pattern": row.pattern})
        await session.flush()
        await session.refresh(row)
        out = FilterOut.model_validate(row)
    await resources.filters.set_enabled(filter_id, patch.enabled)
    return out
