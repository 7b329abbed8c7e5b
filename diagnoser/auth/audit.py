"""The audit log: who changed what, and when, in the database (GET /v1/audit)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from diagnoser.store.database import Sessions
from diagnoser.store.models import AuditEntryRow, utcnow

MAX_SUBJECT = 512


def record(
    session: Session | AsyncSession,
    actor: str,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> AuditEntryRow:
    """Add one entry to the caller's transaction (it commits with the change it describes).

    `actor` is a token id, `cli:<user>` or `open`; `action` a dotted verb such as
    `rules.reload`, `token.create`, `action.complete`; `subject` what it acted on.
    """
    row = AuditEntryRow(
        at=utcnow(), actor=actor, action=action, subject=subject[:MAX_SUBJECT], detail=detail or {}
    )
    session.add(row)
    return row


async def log_change(
    sessions: Sessions,
    actor: str,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """One entry in a transaction of its own: for changes that are not database writes (a rule
    reload, a file written)."""
    async with sessions.begin() as session:
        record(session, actor, action, subject, detail)
