"""The LLM stage across replicas, on real PostgreSQL with a scripted LLM over real HTTP."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy import select

from diagnoser.config import LlmSettings
from diagnoser.diagnosis.escalation import Escalator
from diagnoser.diagnosis.trace import Trace
from diagnoser.llm.cache import VerdictCache
from diagnoser.llm.client import LlmClient
from diagnoser.llm.prompt import PromptLine
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import DiagnosisRow, EscalationRow, JobRow
from tests.llm.scripted_llm import Reply, scripted_llm

ANSWER = {
    "failure_type": "flux_capacitor_drift",
    "category": "user_code",
    "fault": "user",
    "culprit_nodes": [],
    "action": "notify_user",
    "evidence": [1],
    "summary": "The training script raised FluxCapacitorError.",
    "mitigation": "Fix the capacitor.",
}
TRACE = Trace(
    "job-e",
    (PromptLine(1, "gpu-1", 0, "FluxCapacitorError: drifted", flagged=True),),
    frozenset({"gpu-1"}),
    0,
)


async def escalated(sessions: Sessions, job: str) -> str:
    diagnosis_id = str(uuid.uuid4())
    async with sessions.begin() as session:
        session.add(JobRow(id=job))
        await session.flush()
        session.add(
            DiagnosisRow(
                id=diagnosis_id,
                job_id=job,
                status="open",
                summary="no rule explains it",
                source="rule",
                action="escalate",
                confidence=0.3,
                evidence=[],
                rule_ids=[],
                affected_ranks=[],
            )
        )
    return diagnosis_id


async def test_a_dead_replica_s_pending_escalation_is_asked_by_a_survivor(
    postgres_url: str,
) -> None:
    """Replica A stored escalations and died before its workers took them: B finds the one
    from before its start at once, the one after at its next sweep (`sweep_interval_s`, not
    the 30 s default), and hands the verdicts to its flow; the question was asked once."""
    db = parse_database_url(postgres_url)
    upgrade(db)
    a, b = (Sessions(create_service_engine(db), db) for _ in range(2))
    applied: list[tuple[str, dict[str, Any]]] = []

    async def apply(diagnosis_id: str, job_id: str, record: dict[str, Any]) -> None:
        applied.append((diagnosis_id, record))

    async def states() -> list[str]:
        async with b() as session:
            return list(
                await session.scalars(select(EscalationRow.state).order_by(EscalationRow.id))
            )

    async def until(expected: list[str]) -> None:
        for _ in range(400):  # up to 20 s
            if await states() == expected:
                return
            await asyncio.sleep(0.05)

    try:
        with scripted_llm([Reply(ANSWER)]) as llm:
            settings = LlmSettings(
                base_url=llm.base_url,
                model="scripted",
                quiet_s=0,
                timeout_s=5,
                max_retries=0,
                samples=1,
                sweep_interval_s=0.2,
            )
            clients = [LlmClient(settings), LlmClient(settings)]
            dead = Escalator(a, clients[0], VerdictCache(a, None), settings, apply)
            survivor = Escalator(b, clients[1], VerdictCache(b, None), settings, apply)
            await dead.submit(await escalated(a, "job-0"), TRACE)
            running = asyncio.create_task(survivor.run())
            try:
                await until(["done"])  # B's first sweep (at its start) found that one
                diagnosis_id = await escalated(a, "job-a")
                await dead.submit(diagnosis_id, TRACE)  # queued in A's memory, never worked
                await until(["done", "done"])
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                for client in clients:
                    await client.aclose()
            asked = len(llm.completions)
        assert await states() == ["done", "done"]
        assert [(d, r["action"]) for d, r in applied][1:] == [(diagnosis_id, "notify_user")]
        assert asked == 1  # the second question is the first's: answered from the cache
    finally:
        await a.close()
        await b.close()
