"""Queries for diagnoses, their culprits, feedback and the recovery-action outbox."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.actions.policy import PolicyConfig
from diagnoser.store.actions import cancel_open, queue_plan
from diagnoser.store.cursor import decode_cursor, encode_cursor
from diagnoser.store.models import (
    DiagnosisCulpritRow,
    DiagnosisRow,
    JobEventRow,
    LogStreamRow,
)

ACTIVE = ("open", "actioned")
OUTBOX_ACTIONS = ("cordon_node_and_restart", "restart_job")
"""Actions the operator executes; notify and escalate reach people, not the cluster."""
EARLIER_ATTEMPT = "earlier_attempt"
"""Evidence key: stored before the job restarted. Kept, but not correlated with the new attempt."""


@dataclass(frozen=True, slots=True)
class DiagnosisFilter:
    job_id: str | None = None
    node: str | None = None
    category: str | None = None
    status: str | None = None
    since: datetime | None = None


def filtered(criteria: DiagnosisFilter) -> Select[DiagnosisRow]:
    query = select(DiagnosisRow).order_by(DiagnosisRow.updated_at.desc(), DiagnosisRow.id.desc())
    if criteria.job_id:
        query = query.where(DiagnosisRow.job_id == criteria.job_id)
    if criteria.category:
        query = query.where(DiagnosisRow.category == criteria.category)
    if criteria.status:
        query = query.where(DiagnosisRow.status == criteria.status)
    if criteria.since:
        query = query.where(DiagnosisRow.updated_at >= criteria.since)
    if criteria.node:
        query = query.where(
            DiagnosisRow.id.in_(
                select(DiagnosisCulpritRow.diagnosis_id).where(
                    DiagnosisCulpritRow.node == criteria.node
                )
            )
        )
    return query


async def page(
    session: AsyncSession, criteria: DiagnosisFilter, limit: int, cursor: str | None
) -> tuple[list[DiagnosisRow], str | None]:
    query = filtered(criteria)
    if cursor:
        at, row_id = decode_cursor(cursor)
        query = query.where(
            or_(
                DiagnosisRow.updated_at < at,
                and_(DiagnosisRow.updated_at == at, DiagnosisRow.id < row_id),
            )
        )
    rows = list(await session.scalars(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].updated_at, rows[-1].id) if more else None


async def active_for_job(session: AsyncSession, job_id: str) -> DiagnosisRow | None:
    """The job's current incident: the newest diagnosis still open or actioned."""
    return await session.scalar(
        select(DiagnosisRow)
        .where(DiagnosisRow.job_id == job_id, DiagnosisRow.status.in_(ACTIVE))
        .order_by(DiagnosisRow.created_at.desc())
        .limit(1)
    )


async def job_nodes(session: AsyncSession, job_id: str) -> list[str]:
    """Every node the job's logs came from (to any replica, before any restart)."""
    query = select(LogStreamRow.node).where(LogStreamRow.job_id == job_id).distinct()
    return list(await session.scalars(query))


async def end_attempt(session: AsyncSession, job_id: str) -> None:
    """The job restarted: the evidence its open diagnosis holds is the earlier attempt's."""
    row = await active_for_job(session, job_id)
    if row is None or all(record.get(EARLIER_ATTEMPT) for record in row.evidence):
        return
    row.evidence = [{**record, EARLIER_ATTEMPT: True} for record in row.evidence]


async def lifecycle_events(session: AsyncSession, job_id: str) -> list[JobEventRow]:
    """The job's newest lifecycle event per node (node None: the whole job), for hang checks."""
    newest = (
        select(JobEventRow.node, func.max(JobEventRow.id).label("id"))
        .where(JobEventRow.job_id == job_id)
        .group_by(JobEventRow.node)
        .subquery()
    )
    return list(
        await session.scalars(select(JobEventRow).join(newest, JobEventRow.id == newest.c.id))
    )


async def set_culprits(session: AsyncSession, diagnosis_id: str, nodes: Sequence[str]) -> None:
    await session.execute(
        delete(DiagnosisCulpritRow).where(DiagnosisCulpritRow.diagnosis_id == diagnosis_id)
    )
    session.add_all(DiagnosisCulpritRow(diagnosis_id=diagnosis_id, node=n) for n in set(nodes))


async def supersede_pending(session: AsyncSession, diagnosis_id: str) -> None:
    """The diagnosis's unclaimed actions are no longer wanted (a hang that resolved itself)."""
    await cancel_open(session, "the diagnosis resolved itself", diagnosis_id=diagnosis_id)


async def queue_action(
    session: AsyncSession, row: DiagnosisRow, policy: PolicyConfig | None = None
) -> None:
    """Outbox: the diagnosis's plan, judged by the policy, written in its transaction.

    A changed recommendation cancels the pending actions it no longer has (a restart upgraded
    to a cordon); the same recommendation twice is one plan (the idempotency keys). Without
    a policy the defaults apply, dry-run included: nothing is released.
    """
    await queue_plan(session, row, policy or PolicyConfig())


@dataclass(frozen=True, slots=True)
class NodeStats:
    node: str
    incidents: int
    last_incident_at: datetime | None


async def node_stats(session: AsyncSession, node: str | None = None) -> list[NodeStats]:
    query = (
        select(
            DiagnosisCulpritRow.node,
            func.count(DiagnosisRow.id),
            func.max(DiagnosisRow.created_at),
        )
        .join(DiagnosisRow, DiagnosisRow.id == DiagnosisCulpritRow.diagnosis_id)
        .group_by(DiagnosisCulpritRow.node)
        .order_by(func.max(DiagnosisRow.created_at).desc())
    )
    if node is not None:
        query = query.where(DiagnosisCulpritRow.node == node)
    rows: list[Any] = list(await session.execute(query))
    return [NodeStats(name, count, last) for name, count, last in rows]
