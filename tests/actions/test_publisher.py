"""The Redis relay of released actions, with two replicas on one real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from diagnoser.actions.policy import PolicyConfig
from diagnoser.actions.publisher import STREAM, ActionPublisher, ActionWake
from diagnoser.store.actions import unpublished
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.diagnoses import queue_action
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import DiagnosisRow, JobRow, LogStreamRow, utcnow
from tests.servers import RedisServer

LIVE = PolicyConfig(dry_run=False, blast_radius_percent=100)


@pytest.fixture
async def replicas(postgres_url: str) -> AsyncIterator[list[Sessions]]:
    db = parse_database_url(postgres_url)
    upgrade(db)
    opened = [Sessions(create_service_engine(db), db) for _ in range(2)]
    yield opened
    for sessions in opened:
        await sessions.close()


async def restart_job(sessions: Sessions, job: str) -> None:
    """A diagnosis recommending a restart: one released action."""
    async with sessions.begin() as session:
        session.add(JobRow(id=job, namespace="ml", kind="PyTorchJob", name=job))
        await session.flush()
        session.add(LogStreamRow(job_id=job, stream="node-1", node="node-1"))
        row = DiagnosisRow(
            id=str(uuid.uuid4()),
            job_id=job,
            status="open",
            failure_type="nccl_timeout",
            category="network",
            summary="timeout",
            culprit_nodes=[],
            source="rule",
            confidence=0.9,
            rule_ids=["nccl-watchdog-timeout"],
            evidence=[],
            action="restart_job",
        )
        session.add(row)
        await session.flush()
        await queue_action(session, row, LIVE)


async def test_a_relay_skips_the_actions_another_replica_s_relay_is_adding(
    replicas: list[Sessions], redis_server: RedisServer
) -> None:
    """Replica A's relay is adding the released actions (its transaction still open) when
    replica B's relay runs: B adds none of them, and once A is done nothing is left to add."""
    redis = Redis.from_url(redis_server.url)
    try:
        jobs = [f"relay-{uuid.uuid4().hex[:8]}" for _ in range(3)]
        for job in jobs:
            await restart_job(replicas[0], job)
        relay_b = ActionPublisher(replicas[1], redis, ActionWake())
        async with replicas[0].begin() as holding:
            held = await unpublished(holding)
            assert {row.job_id for row in held} >= set(jobs)
            added_by_b = await asyncio.wait_for(relay_b.publish(), 10)
            for row in held:
                row.published_at = utcnow()
        assert added_by_b == 0
        assert await relay_b.publish() == 0
        stream = str(await redis.xrange(STREAM))
        assert not [job for job in jobs if job in stream]
    finally:
        await redis.aclose()
