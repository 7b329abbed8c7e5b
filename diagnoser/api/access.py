"""Tokens and the audit log, for admins: GET /v1/audit, /v1/tokens (create, list, revoke)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from diagnoser.api.deps import ResourcesDep
from diagnoser.api.errors import ApiError, responses
from diagnoser.auth import tokens
from diagnoser.auth.audit import record
from diagnoser.auth.binding import JOB_PATTERN
from diagnoser.auth.roles import Gate, PrincipalDep
from diagnoser.auth.tokens import Role
from diagnoser.ingest.schemas import NodeName
from diagnoser.store.models import ApiTokenRow, AuditEntryRow, utcnow

router = APIRouter(prefix="/v1", tags=["access"])
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


class AuditEntry(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str
    action: str
    subject: str
    detail: dict[str, Any]


class AuditPage(BaseModel):
    entries: list[AuditEntry]
    next_before: int | None
    """Pass as `before` for the next (older) page."""


@router.get("/audit", response_model=AuditPage)
async def list_audit(
    resources: ResourcesDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    action: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z_.-]+$")] = None,
) -> AuditPage:
    """Who changed what and when, newest first."""
    query = select(AuditEntryRow).order_by(AuditEntryRow.id.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(AuditEntryRow.id < before)
    if action is not None:
        query = query.where(AuditEntryRow.action == action)
    async with resources.sessions() as session:
        rows = list(await session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(
        entries=[AuditEntry.model_validate(r) for r in rows],
        next_before=rows[-1].id if more else None,
    )


class TokenView(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    role: Role
    node: str | None
    jobs: str | None
    description: str
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal[Role.READ, Role.OPERATOR, Role.ADMIN]
    expires_in_s: Annotated[int | None, Field(ge=60, le=10 * 365 * 86400)] = None
    description: Annotated[str, Field(max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")] = ""


class IngestTokenIn(TokenIn):
    """Only ingest tokens are bound, to a node and/or a job-id glob."""

    role: Literal[Role.INGEST]  # type: ignore[assignment]
    node: NodeName | None = None
    jobs: Annotated[str | None, Field(pattern=JOB_PATTERN)] = None


class TokenCreated(TokenView):
    token: str
    """The token itself: shown this once, stored only as a digest."""


@router.get("/tokens", response_model=list[TokenView])
async def list_tokens(resources: ResourcesDep) -> list[ApiTokenRow]:
    async with resources.sessions() as session:
        return await session.run_sync(tokens.listing)


@router.post("/tokens", response_model=TokenCreated, status_code=201, responses=responses(400, 422))
async def create_token(
    body: IngestTokenIn | TokenIn, resources: ResourcesDep, principal: PrincipalDep
) -> TokenCreated:
    """A new token; `node` and `jobs` bind an ingest token (docs/security.md)."""
    node, jobs = (body.node, body.jobs) if isinstance(body, IngestTokenIn) else (None, None)
    expires = utcnow() + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    async with resources.sessions.begin() as session:
        issued = await session.run_sync(
            lambda s: tokens.issue(
                s, Role(body.role), node=node, jobs=jobs, expires_at=expires,
                description=body.description, created_by=principal.actor,
            )
        )  # fmt: skip
        record(session, principal.actor, "token.create", issued.row.id, _token_detail(issued.row))
        view = TokenView.model_validate(issued.row)
    return TokenCreated(**view.model_dump(), token=issued.raw)


@router.delete("/tokens/{token_id}", response_model=TokenView, responses=responses(404))
async def revoke_token(
    token_id: TokenId, request: Request, resources: ResourcesDep, principal: PrincipalDep
) -> TokenView:
    """Revoke a token (idempotent): every later request with it to this replica gets 401,
    to the others within `DIAGNOSER_AUTH__TOKEN_CACHE_S` (their cache of verified tokens)."""
    async with resources.sessions.begin() as session:
        row = await session.run_sync(lambda s: tokens.revoke(s, token_id))
        if row is None:
            raise ApiError(404, "not_found", f"no token {token_id!r}")
        record(session, principal.actor, "token.revoke", token_id, _token_detail(row))
        view = TokenView.model_validate(row)
    gate: Gate = request.app.state.gate
    gate.tokens.forget(token_id)
    return view


def _token_detail(row: ApiTokenRow) -> dict[str, Any]:
    return {"role": row.role, "node": row.node, "jobs": row.jobs}
