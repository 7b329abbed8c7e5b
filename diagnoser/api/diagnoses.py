"""On-call: diagnoses with filters and cursor pages, feedback, and a live stream of changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from diagnoser.api.actions import policy as action_policy
from diagnoser.api.deps import (
    CursorQuery,
    DiagnosisId,
    JobId,
    NameFilter,
    Resources,
    ResourcesDep,
    SinceQuery,
)
from diagnoser.api.errors import ApiError, responses
from diagnoser.auth.audit import record
from diagnoser.auth.roles import PrincipalDep
from diagnoser.diagnosis.correlate import Source
from diagnoser.diagnosis.schemas import (
    DiagnosisPage,
    DiagnosisStatus,
    DiagnosisView,
    FeedbackIn,
    FeedbackKind,
    FeedbackView,
)
from diagnoser.rules import Category
from diagnoser.store.actions import cancel_open, undo_for_feedback
from diagnoser.store.cursor import CursorError
from diagnoser.store.diagnoses import DiagnosisFilter, page, queue_action, set_culprits
from diagnoser.store.models import DiagnosisRow, FeedbackRow, utcnow

router = APIRouter(prefix="/v1", tags=["diagnoses"])
KEEPALIVE_S = 15.0


async def _page(
    resources: Resources, criteria: DiagnosisFilter, limit: int, cursor: str | None
) -> DiagnosisPage:
    try:
        async with resources.sessions() as session:
            rows, next_cursor = await page(session, criteria, limit, cursor)
    except CursorError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from exc
    return DiagnosisPage(
        diagnoses=[DiagnosisView.model_validate(row) for row in rows], next_cursor=next_cursor
    )


@router.get("/diagnoses", response_model=DiagnosisPage)
async def list_diagnoses(
    resources: ResourcesDep,
    job: NameFilter = None,
    node: NameFilter = None,
    category: Category | None = None,
    status: DiagnosisStatus | None = None,
    since: SinceQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
) -> DiagnosisPage:
    """Newest change first. `node` matches diagnoses that name it as a culprit."""
    criteria = DiagnosisFilter(
        job_id=job,
        node=node,
        category=category.value if category else None,
        status=status.value if status else None,
        since=since,
    )
    return await _page(resources, criteria, limit, cursor)


@router.get("/jobs/{job_id}/diagnoses", response_model=DiagnosisPage)
async def job_diagnoses(
    job_id: JobId,
    resources: ResourcesDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
) -> DiagnosisPage:
    return await _page(resources, DiagnosisFilter(job_id=job_id), limit, cursor)


@router.get(
    "/diagnoses/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream_diagnoses(resources: ResourcesDep) -> StreamingResponse:
    """Server-sent events: `event: diagnosis` with the diagnosis as JSON, on every change."""
    queue = resources.hub.subscribe()

    async def events() -> AsyncIterator[str]:
        try:
            yield ": connected\n\n"
            while True:
                try:
                    view = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if view is None:  # too slow: cut off, the client reconnects
                    return
                yield f"event: diagnosis\nid: {view.id}\ndata: {view.model_dump_json()}\n\n"
        finally:
            resources.hub.unsubscribe(queue)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _get(resources: Resources, diagnosis_id: str) -> DiagnosisRow:
    async with resources.sessions() as session:
        row = await session.get(DiagnosisRow, diagnosis_id)
    if row is None:
        raise ApiError(404, "not_found", f"no diagnosis {diagnosis_id!r}")
    return row


@router.get("/diagnoses/{diagnosis_id}", response_model=DiagnosisView, responses=responses(404))
async def get_diagnosis(diagnosis_id: DiagnosisId, resources: ResourcesDep) -> DiagnosisRow:
    return await _get(resources, diagnosis_id)


@router.get(
    "/diagnoses/{diagnosis_id}/feedback",
    response_model=list[FeedbackView],
    responses=responses(404),
)
async def list_feedback(diagnosis_id: DiagnosisId, resources: ResourcesDep) -> list[FeedbackRow]:
    await _get(resources, diagnosis_id)
    async with resources.sessions() as session:
        return list(
            await session.scalars(
                select(FeedbackRow)
                .where(FeedbackRow.diagnosis_id == diagnosis_id)
                .order_by(FeedbackRow.created_at)
            )
        )


@router.post(
    "/diagnoses/{diagnosis_id}/feedback",
    response_model=FeedbackView,
    status_code=201,
    responses=responses(400, 404),
)
async def post_feedback(
    diagnosis_id: DiagnosisId,
    feedback: FeedbackIn,
    resources: ResourcesDep,
    principal: PrincipalDep,
) -> FeedbackRow:
    """Confirm, override (category and/or action), dismiss or resolve; every verdict is kept.

    An override makes the diagnosis a human one: later evidence still adds to it but no longer
    changes its category or action. Dismissing or resolving cancels pending actions;
    dismissing (the diagnosis was wrong) also queues an uncordon for each cordon it made.
    """
    async with resources.sessions.begin() as session:
        row = await session.get(DiagnosisRow, diagnosis_id)
        if row is None:
            raise ApiError(404, "not_found", f"no diagnosis {diagnosis_id!r}")
        if feedback.kind is FeedbackKind.OVERRIDE:
            row.category = feedback.category.value if feedback.category else row.category
            row.action = feedback.action.value if feedback.action else row.action
            row.source = Source.HUMAN.value
            row.summary = f"{row.summary} [overridden by {feedback.author}]"
            await set_culprits(session, row.id, row.culprit_nodes)
            await queue_action(session, row, action_policy(resources))
        elif feedback.kind is FeedbackKind.DISMISS:
            row.status = DiagnosisStatus.DISMISSED.value
            await undo_for_feedback(session, row, action_policy(resources), feedback.author)
        elif feedback.kind is FeedbackKind.RESOLVE:
            row.status = DiagnosisStatus.RESOLVED.value
            await cancel_open(session, f"resolved by {feedback.author}", diagnosis_id=row.id)
        row.updated_at = utcnow()
        entry = FeedbackRow(
            diagnosis_id=diagnosis_id,
            kind=feedback.kind.value,
            category=feedback.category.value if feedback.category else None,
            action=feedback.action.value if feedback.action else None,
            author=feedback.author,
            comment=feedback.comment,
        )
        session.add(entry)
        record(
            session,
            principal.actor,
            f"feedback.{feedback.kind.value}",
            diagnosis_id,
            {"author": feedback.author, "category": entry.category, "action": entry.action},
        )
        await session.flush()
        await session.refresh(entry)
    resources.hub.publish(DiagnosisView.model_validate(row))
    resources.action_wake.notify()
    return entry
