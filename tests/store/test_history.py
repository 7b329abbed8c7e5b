"""Precedents and resolutions, read from real SQLite and PostgreSQL databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.llm.retrieval import DecidedBy
from diagnoser.store.database import create_service_engine, parse_database_url
from diagnoser.store.history import llm_resolutions, recent_precedents
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import DiagnosisRow, FeedbackRow, JobRow

START = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
async def session(database_url: str) -> AsyncIterator[AsyncSession]:
    db = parse_database_url(database_url)
    upgrade(db)
    engine = create_service_engine(db)
    async with AsyncSession(engine) as opened:
        opened.add(JobRow(id="job-1"))
        await opened.flush()
        yield opened
    await engine.dispose()


def add(
    session: AsyncSession,
    name: str,
    minute: int,
    source: str,
    action: str = "notify_user",
    status: str = "open",
    text: str = "FluxCapacitorError: drift",
    llm: dict[str, Any] | None = None,
) -> None:
    at = START + timedelta(minutes=minute)
    session.add(
        DiagnosisRow(
            id=name,
            job_id="job-1",
            status=status,
            source=source,
            action=action,
            category="user_code",
            failure_type="FluxCapacitorError",
            rule_ids=["python_unclassified_exception"] if source == "rule" else [],
            evidence=[{"text": text, "node": "gpu-1"}],
            llm=llm,
            created_at=at,
            updated_at=at,
        )
    )


def verdict(flagged: bool = True, decided: bool = True) -> dict[str, Any]:
    return {
        "decided": decided,
        "failure_type": "flux_drift",
        "summary": "It drifted.",
        "culprit_nodes": [],
        "evidence": [
            {"line": 1, "node": "gpu-1", "text": "[rank0]: iteration 5", "flagged": False},
            {"line": 2, "node": "gpu-1", "text": "FluxCapacitorError: drift", "flagged": flagged},
        ],
    }


async def test_precedents_are_decided_by_rules_or_people_newest_first(
    session: AsyncSession,
) -> None:
    add(session, "rule", 1, "rule")
    add(session, "escalated", 2, "rule", action="escalate")
    add(session, "dismissed", 3, "rule", status="dismissed")
    add(session, "llm-alone", 4, "llm", llm=verdict())
    add(session, "llm-confirmed", 5, "llm", llm=verdict())
    add(session, "overridden", 6, "human", action="restart_job")
    add(session, "asking", 7, "rule")
    await session.flush()
    session.add(FeedbackRow(diagnosis_id="llm-confirmed", kind="confirm", author="oncall"))
    session.add(FeedbackRow(diagnosis_id="overridden", kind="override", author="oncall"))
    session.add(FeedbackRow(diagnosis_id="llm-alone", kind="dismiss", author="oncall"))
    await session.flush()

    found = await recent_precedents(session, 10, exclude="asking")
    assert [(p.diagnosis_id, p.decided_by) for p in found] == [
        ("overridden", DecidedBy.OVERRIDDEN),
        ("llm-confirmed", DecidedBy.CONFIRMED),
        ("rule", DecidedBy.RULE),
    ]
    assert found[-1].rule_id == "python_unclassified_exception"
    assert found[0].texts == ("FluxCapacitorError: drift",)
    assert [p.diagnosis_id for p in await recent_precedents(session, 1)] == ["asking"]


async def test_resolutions_are_llm_decisions_that_cited_a_failure_line(
    session: AsyncSession,
) -> None:
    add(session, "decided", 1, "llm", llm=verdict())
    add(session, "undecided", 2, "rule", action="escalate", llm=verdict(decided=False))
    add(session, "tail-only", 3, "llm", llm=verdict(flagged=False))
    add(session, "person", 4, "human", action="restart_job", llm=verdict())
    add(session, "rule-later", 5, "rule", llm=verdict())
    await session.flush()

    found = await llm_resolutions(session, 10)
    assert [(r.diagnosis_id, r.action, r.by_person) for r in found] == [
        ("person", "restart_job", True),
        ("decided", "notify_user", False),
    ]
    assert found[1].line == "FluxCapacitorError: drift"
    assert found[1].failure_type == "flux_drift"
