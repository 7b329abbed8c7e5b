"""The operator API over the action outbox: claim (long poll), complete, extend, list, stream.

And the opt-outs: nodes and jobs that recovery actions leave alone. See docs/actions.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import StreamingResponse

from diagnoser.actions.kinds import (
    ActionKind,
    ActionPage,
    ActionState,
    ActionView,
    ClaimIn,
    ClaimOut,
    CompleteIn,
    ExtendIn,
    OptOutIn,
    OptOutView,
)
from diagnoser.actions.policy import PolicyConfig
from diagnoser.api.deps import CursorQuery, JobId, NameFilter, NodePath, Resources, ResourcesDep
from diagnoser.api.errors import ApiError, responses
from diagnoser.auth.audit import record
from diagnoser.auth.roles import PrincipalDep
from diagnoser.store import actions as outbox
from diagnoser.store.cursor import CursorError
from diagnoser.store.models import ActionRow, utcnow

router = APIRouter(prefix="/v1", tags=["actions"])
KEEPALIVE_S = 15.0
ActionId = Annotated[int, Path(ge=1, le=2**63 - 1)]
DESCRIBED = {
    409: "The action is not leased to this operator (another holds it, or it is not claimed)",
}


def policy(resources: Resources) -> PolicyConfig:
    settings = resources.settings
    return PolicyConfig.from_settings(settings.actions, settings.llm.min_agreement)


def _view(row: ActionRow) -> ActionView:
    return ActionView.model_validate(row)


async def _claim_once(resources: Resources, body: ClaimIn, actor: str) -> list[ActionRow]:
    async with resources.sessions.begin() as session:
        rows = await outbox.claim(
            session,
            body.operator_id,
            body.kinds,
            body.max,
            timedelta(seconds=body.lease_seconds),
            resources.settings.actions.max_attempts,
            skip_locked=resources.database.backend == "postgresql",
        )
        for row in rows:
            record(session, actor, "action.claim", str(row.id), {"operator_id": body.operator_id})
        return rows


@router.post(
    "/actions/claim",
    response_model=ClaimOut,
    responses=responses(400, 422),
)
async def claim_actions(
    body: ClaimIn, resources: ResourcesDep, principal: PrincipalDep
) -> ClaimOut:
    """Lease up to `max` claimable actions (oldest first), waiting up to `wait_seconds` for one.

    An action whose lease ran out is claimable again: complete it with the idempotency key in
    mind (the same action may arrive twice)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(body.wait_seconds, resources.settings.actions.claim_max_wait_s)
    while True:
        ticket = resources.action_wake.ticket()
        rows = await _claim_once(resources, body, principal.actor)
        left = deadline - loop.time()
        if rows or left <= 0:
            break
        await resources.action_wake.wait(
            ticket, min(left, resources.settings.actions.poll_interval_s)
        )
    if rows:
        resources.action_wake.notify()
    return ClaimOut(actions=[_view(r) for r in rows])


@router.post(
    "/actions/{action_id:int}/complete",
    response_model=ActionView,
    responses=responses(400, 404, 409, 422, described=DESCRIBED),
)
async def complete_action(
    action_id: ActionId, body: CompleteIn, resources: ResourcesDep, principal: PrincipalDep
) -> ActionView:
    """Done or failed. The same completion again answers the same action (idempotent)."""
    try:
        async with resources.sessions.begin() as session:
            done = await outbox.complete(
                session,
                action_id,
                body.operator_id,
                body.status,
                body.message,
                body.result,
                policy(resources),
            )
            if not done.repeated:
                detail = {"operator_id": body.operator_id, "status": body.status}
                record(session, principal.actor, "action.complete", str(action_id), detail)
            view = _view(done.action)
    except outbox.ActionNotFoundError as exc:
        raise ApiError(404, "not_found", f"no action {action_id}") from exc
    except outbox.LeaseConflictError as exc:
        raise ApiError(409, "conflict", str(exc)) from exc
    if not done.repeated:
        resources.action_wake.notify()
    return view


@router.post(
    "/actions/{action_id:int}/extend",
    response_model=ActionView,
    responses=responses(400, 404, 409, 422, described=DESCRIBED),
)
async def extend_action(action_id: ActionId, body: ExtendIn, resources: ResourcesDep) -> ActionView:
    """Renew a lease before it runs out (a long restart, a verification still running)."""
    try:
        async with resources.sessions.begin() as session:
            row = await outbox.extend(
                session, action_id, body.operator_id, timedelta(seconds=body.lease_seconds)
            )
            return _view(row)
    except outbox.ActionNotFoundError as exc:
        raise ApiError(404, "not_found", f"no action {action_id}") from exc
    except outbox.LeaseConflictError as exc:
        raise ApiError(409, "conflict", str(exc)) from exc


@router.get("/actions", response_model=ActionPage, responses=responses(422))
async def list_actions(
    resources: ResourcesDep,
    job_id: NameFilter = None,
    node: NameFilter = None,
    kind: ActionKind | None = None,
    state: ActionState | None = None,
    diagnosis_id: NameFilter = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
) -> ActionPage:
    """Newest change first. `node` matches cordons and uncordons of that node."""
    criteria = outbox.ActionFilter(
        job_id=job_id,
        node=node,
        kind=kind.value if kind else None,
        state=state.value if state else None,
        diagnosis_id=diagnosis_id,
    )
    try:
        async with resources.sessions() as session:
            rows, next_cursor = await outbox.page(session, criteria, limit, cursor)
    except CursorError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from exc
    return ActionPage(items=[_view(r) for r in rows], next_cursor=next_cursor)


@router.get(
    "/actions/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream_actions(resources: ResourcesDep) -> StreamingResponse:
    """Server-sent events: `event: action` with the action as JSON, on every state change
    (of every replica: the stream reads the database)."""
    interval = resources.settings.actions.poll_interval_s

    async def events() -> AsyncIterator[str]:
        seen: dict[int, str] = {}
        since = utcnow()
        quiet = 0.0
        yield ": connected\n\n"
        while True:
            ticket = resources.action_wake.ticket()
            # Commits can land out of order by a little: look back one interval, dedupe.
            async with resources.sessions() as session:
                rows = await outbox.changed_since(session, since - timedelta(seconds=interval))
            fresh = [r for r in rows if seen.get(r.id) != r.updated_at.isoformat() + r.state]
            for row in fresh:
                seen[row.id] = row.updated_at.isoformat() + row.state
                yield f"event: action\nid: {row.id}\ndata: {_view(row).model_dump_json()}\n\n"
            if rows:
                since = max(since, rows[-1].updated_at)
            if len(seen) > 10_000:
                seen.clear()
            quiet = 0.0 if fresh else quiet + interval
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keepalive\n\n"
            await resources.action_wake.wait(ticket, interval)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


@router.get("/actions/{action_id:int}", response_model=ActionView, responses=responses(404, 422))
async def get_action(action_id: ActionId, resources: ResourcesDep) -> ActionView:
    async with resources.sessions() as session:
        row = await session.get(ActionRow, action_id)
    if row is None:
        raise ApiError(404, "not_found", f"no action {action_id}")
    return _view(row)


async def _opt_out(
    resources: Resources,
    scope: Literal["node", "job"],
    name: str,
    body: OptOutIn | None,
    actor: str,
) -> OptOutView:
    body = body or OptOutIn()
    async with resources.sessions.begin() as session:
        row = await outbox.set_opt_out(session, scope, name, body.reason, body.author)
        record(session, actor, f"optout.{scope}.set", name, {"reason": body.reason})
        return OptOutView.model_validate(row)


async def _opt_in(resources: Resources, scope: str, name: str, actor: str) -> Response:
    async with resources.sessions.begin() as session:
        found = await outbox.clear_opt_out(session, scope, name)
        if found:
            record(session, actor, f"optout.{scope}.clear", name)
    if not found:
        raise ApiError(404, "not_found", f"{scope} {name!r} has not opted out")
    return Response(status_code=204)


@router.put(
    "/nodes/{node}/opt-out",
    response_model=OptOutView,
    responses=responses(400, 422),
    tags=["nodes"],
)
async def opt_out_node(
    node: NodePath, resources: ResourcesDep, principal: PrincipalDep, body: OptOutIn | None = None
) -> OptOutView:
    """No cordon of this node until the opt-out is deleted (undo and notify still run)."""
    return await _opt_out(resources, "node", node, body, principal.actor)


@router.delete(
    "/nodes/{node}/opt-out",
    status_code=204,
    response_class=Response,
    responses=responses(404, 422),
    tags=["nodes"],
)
async def opt_in_node(node: NodePath, resources: ResourcesDep, principal: PrincipalDep) -> Response:
    return await _opt_in(resources, "node", node, principal.actor)


@router.put(
    "/jobs/{job_id}/opt-out",
    response_model=OptOutView,
    responses=responses(400, 422),
    tags=["jobs"],
)
async def opt_out_job(
    job_id: JobId, resources: ResourcesDep, principal: PrincipalDep, body: OptOutIn | None = None
) -> OptOutView:
    """No cordon, restart or verification for this job (people are still notified)."""
    return await _opt_out(resources, "job", job_id, body, principal.actor)


@router.delete(
    "/jobs/{job_id}/opt-out",
    status_code=204,
    response_class=Response,
    responses=responses(404, 422),
    tags=["jobs"],
)
async def opt_in_job(job_id: JobId, resources: ResourcesDep, principal: PrincipalDep) -> Response:
    return await _opt_in(resources, "job", job_id, principal.actor)
