"""Queries over past diagnoses for the LLM stage: precedents to retrieve, resolutions to learn from.

Both read only the most recent rows (a limit from Settings), so their cost stays bounded as the
history grows; similarity and counting happen in Python (diagnoser/llm/retrieval.py,
diagnoser/llm/suggestions.py), the same way on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.llm.retrieval import DecidedBy, Precedent
from diagnoser.llm.suggestions import Resolution
from diagnoser.store.models import DiagnosisRow, FeedbackRow

HUMAN_VERDICTS = ("confirm", "override")
RULE_SOURCES = ("rule", "correlation")
DISMISSED = "dismissed"
"""A person said the diagnosis was wrong: it is nobody's precedent."""


async def recent_precedents(
    session: AsyncSession, limit: int, exclude: str | None = None
) -> list[Precedent]:
    """The most recent diagnoses a rule decided or a person confirmed or overrode, newest first.

    Diagnoses that still say `escalate` decided nothing and are left out, as are dismissed ones.
    """
    judged = select(FeedbackRow.diagnosis_id).where(FeedbackRow.kind.in_(HUMAN_VERDICTS))
    query = (
        select(
            DiagnosisRow.id,
            DiagnosisRow.source,
            DiagnosisRow.category,
            DiagnosisRow.action,
            DiagnosisRow.failure_type,
            DiagnosisRow.rule_ids,
            DiagnosisRow.evidence,
        )
        .where(
            DiagnosisRow.action != "escalate",
            DiagnosisRow.status != DISMISSED,
            or_(DiagnosisRow.source.in_(RULE_SOURCES), DiagnosisRow.id.in_(judged)),
        )
        .order_by(DiagnosisRow.updated_at.desc(), DiagnosisRow.id)
        .limit(limit)
    )
    if exclude is not None:
        query = query.where(DiagnosisRow.id != exclude)
    rows = (await session.execute(query)).all()
    verdicts: dict[str, str] = {}
    if rows:
        feedback = await session.execute(
            select(FeedbackRow.diagnosis_id, FeedbackRow.kind)
            .where(
                FeedbackRow.diagnosis_id.in_([row.id for row in rows]),
                FeedbackRow.kind.in_(HUMAN_VERDICTS),
            )
            .order_by(FeedbackRow.id)
        )
        for diagnosis_id, given in feedback.all():
            if verdicts.get(diagnosis_id) != "override":
                verdicts[diagnosis_id] = given
    precedents = []
    for row in rows:
        verdict = verdicts.get(row.id)
        if verdict == "override" or row.source == "human":
            decided_by = DecidedBy.OVERRIDDEN
        elif verdict == "confirm":
            decided_by = DecidedBy.CONFIRMED
        else:
            decided_by = DecidedBy(row.source)
        texts = tuple(
            str(record["text"])
            for record in (row.evidence or [])
            if isinstance(record, dict) and isinstance(record.get("text"), str)
        )
        rule_ids = [str(r) for r in row.rule_ids or []]
        precedents.append(
            Precedent(
                diagnosis_id=row.id,
                decided_by=decided_by,
                category=row.category,
                action=row.action,
                failure_type=row.failure_type,
                texts=texts,
                rule_id=rule_ids[0] if len(rule_ids) == 1 else None,
            )
        )
    return precedents


async def llm_resolutions(session: AsyncSession, limit: int) -> list[Resolution]:
    """The most recent diagnoses the LLM decided (kept, or overridden by a person since)."""
    rows = (
        await session.execute(
            select(
                DiagnosisRow.id,
                DiagnosisRow.job_id,
                DiagnosisRow.source,
                DiagnosisRow.category,
                DiagnosisRow.action,
                DiagnosisRow.llm,
            )
            .where(
                DiagnosisRow.llm.is_not(None),
                DiagnosisRow.source.in_(("llm", "human")),
                DiagnosisRow.status != DISMISSED,
            )
            .order_by(DiagnosisRow.updated_at.desc(), DiagnosisRow.id)
            .limit(limit)
        )
    ).all()
    resolutions = []
    for row in rows:
        record = row.llm
        if not isinstance(record, dict) or record.get("decided") is not True:
            continue
        line = root_line(record)
        if line is None:
            continue
        resolutions.append(
            Resolution(
                diagnosis_id=row.id,
                job_id=row.job_id,
                line=line,
                category=row.category,
                action=row.action,
                failure_type=_text(record.get("failure_type")),
                culprit_nodes=tuple(str(n) for n in record.get("culprit_nodes") or []),
                summary=_text(record.get("summary")) or "",
                by_person=row.source == "human",
            )
        )
    return resolutions


def root_line(record: dict[str, Any]) -> str | None:
    """The first cited line a rule had found failure-looking; None when the vote cited none."""
    for cited in record.get("evidence") or []:
        if isinstance(cited, dict) and cited.get("flagged") is True:
            text = cited.get("text")
            if isinstance(text, str) and text.strip():
                return text
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
