"""Queries for the LLM stage: verdict claims (one asker per question) and pending escalations."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.store.models import EscalationRow, LlmVerdictRow, utcnow


class Claim(StrEnum):
    DONE = "done"
    """Answered already: the verdict is in the row."""
    MINE = "mine"
    """This caller asks; the others wait."""
    BUSY = "busy"
    """Another caller is asking and its lease has not run out."""


async def claim_verdict(
    session: AsyncSession, fingerprint: str, model: str, prompt_version: str, lease_s: float
) -> tuple[Claim, dict[str, Any] | None]:
    """Take the question or read its answer; a claim older than the lease is taken over."""
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    inserted = await session.execute(
        insert(LlmVerdictRow)
        .values(
            fingerprint=fingerprint,
            state="pending",
            model=model,
            prompt_version=prompt_version,
            claimed_at=utcnow(),
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["fingerprint"])
        .returning(LlmVerdictRow.fingerprint)
    )
    if inserted.scalar_one_or_none() is not None:
        return Claim.MINE, None
    row = await session.get(LlmVerdictRow, fingerprint, populate_existing=True)
    if row is None:  # released between our insert and read: ask again next poll
        return Claim.BUSY, None
    if row.state == "done":
        return Claim.DONE, row.verdict
    if row.claimed_at > utcnow() - timedelta(seconds=lease_s):
        return Claim.BUSY, None
    taken = await session.execute(
        update(LlmVerdictRow)
        .where(
            LlmVerdictRow.fingerprint == fingerprint,
            LlmVerdictRow.state == "pending",
            LlmVerdictRow.claimed_at == row.claimed_at,
        )
        .values(claimed_at=utcnow())
        .returning(LlmVerdictRow.fingerprint)
        .execution_options(synchronize_session=False)
    )
    return (Claim.MINE, None) if taken.scalar_one_or_none() is not None else (Claim.BUSY, None)


async def store_verdict(session: AsyncSession, fingerprint: str, verdict: dict[str, Any]) -> None:
    await session.execute(
        update(LlmVerdictRow)
        .where(LlmVerdictRow.fingerprint == fingerprint)
        .values(state="done", verdict=verdict)
        .execution_options(synchronize_session=False)
    )


async def release_claim(session: AsyncSession, fingerprint: str) -> None:
    """Give a question back unanswered (the LLM failed), so the next asker may try."""
    await session.execute(
        delete(LlmVerdictRow).where(
            LlmVerdictRow.fingerprint == fingerprint, LlmVerdictRow.state == "pending"
        )
    )


async def add_escalation(
    session: AsyncSession, diagnosis_id: str, job_id: str, fingerprint: str, trace: dict[str, Any]
) -> EscalationRow:
    """Queue the diagnosis for the LLM; a pending escalation of it takes the newer trace."""
    row = await session.scalar(
        select(EscalationRow).where(
            EscalationRow.diagnosis_id == diagnosis_id, EscalationRow.state == "pending"
        )
    )
    if row is not None:
        row.fingerprint = fingerprint
        row.trace = trace
        row.updated_at = utcnow()
    else:
        row = EscalationRow(
            diagnosis_id=diagnosis_id,
            job_id=job_id,
            fingerprint=fingerprint,
            state="pending",
            trace=trace,
            attempts=0,
        )
        session.add(row)
    await session.flush()
    return row


async def pending_escalations(session: AsyncSession, limit: int) -> list[EscalationRow]:
    rows = await session.scalars(
        select(EscalationRow)
        .where(EscalationRow.state == "pending")
        .order_by(EscalationRow.id)
        .limit(limit)
    )
    return list(rows)


async def finish_escalation(
    session: AsyncSession, escalation_id: int, state: str, error: str | None = None
) -> None:
    row = await session.get(EscalationRow, escalation_id)
    if row is None:
        return
    row.state = state
    row.error = error
    row.attempts += 1
    row.updated_at = utcnow()
