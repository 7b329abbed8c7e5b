"""One question, one round of calls: across tasks, across replicas, with and without Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import update

from diagnoser.llm.cache import REDIS_PREFIX, Outcome, VerdictCache
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import LlmVerdictRow, utcnow
from tests.servers import RedisServer

FP = "f" * 64
VERDICT = {"decided": True, "action": "restart_job", "votes": {"network/restart_job": 5}}


async def open_sessions(url: str) -> Sessions:
    db = parse_database_url(url)
    upgrade(db)
    return Sessions(create_service_engine(db), db)


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[Sessions]:
    opened = await open_sessions(database_url)
    yield opened
    await opened.close()


class Asker:
    def __init__(self, outcome: Outcome, delay_s: float = 0.05) -> None:
        self.calls = 0
        self.outcome = outcome
        self.delay_s = delay_s

    async def __call__(self) -> Outcome:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return self.outcome


async def test_a_storm_of_askers_costs_one_call(sessions: Sessions) -> None:
    cache = VerdictCache(sessions, poll_s=0.02)
    asker = Asker(Outcome(VERDICT, cacheable=True))
    results = await asyncio.gather(
        *(cache.get_or_ask(FP, "m", "diagnose.v1", asker) for _ in range(50))
    )
    assert asker.calls == 1
    assert all(r.verdict == VERDICT for r in results)
    assert sum(not r.cached for r in results) == 1
    later = await cache.get_or_ask(FP, "m", "diagnose.v1", asker)
    assert later.cached
    assert asker.calls == 1


async def test_two_replicas_on_one_database_ask_once(sessions: Sessions, database_url: str) -> None:
    other = await open_sessions(database_url)
    try:
        first, second = VerdictCache(sessions, poll_s=0.02), VerdictCache(other, poll_s=0.02)
        asker = Asker(Outcome(VERDICT, cacheable=True), delay_s=0.3)
        results = await asyncio.gather(
            first.get_or_ask(FP, "m", "v1", asker), second.get_or_ask(FP, "m", "v1", asker)
        )
    finally:
        await other.close()
    assert asker.calls == 1
    assert [r.verdict for r in results] == [VERDICT, VERDICT]


async def test_a_failed_ask_is_not_cached(sessions: Sessions) -> None:
    cache = VerdictCache(sessions, poll_s=0.02)
    down = Asker(Outcome({"decided": False}, cacheable=False))
    assert not (await cache.get_or_ask(FP, "m", "v1", down)).cached
    up = Asker(Outcome(VERDICT, cacheable=True))
    again = await cache.get_or_ask(FP, "m", "v1", up)
    assert up.calls == 1
    assert again.verdict == VERDICT


async def test_an_asker_that_died_is_taken_over_after_its_lease(sessions: Sessions) -> None:
    cache = VerdictCache(sessions, lease_s=30, poll_s=0.02)
    async with sessions.begin() as session:
        session.add(LlmVerdictRow(fingerprint=FP, state="pending", model="m", prompt_version="v1"))
    async with sessions.begin() as session:
        await session.execute(
            update(LlmVerdictRow).values(claimed_at=utcnow() - timedelta(seconds=60))
        )
    asker = Asker(Outcome(VERDICT, cacheable=True))
    result = await asyncio.wait_for(cache.get_or_ask(FP, "m", "v1", asker), timeout=10)
    assert asker.calls == 1
    assert result.verdict == VERDICT


@pytest.mark.redis
async def test_redis_holds_answered_verdicts(sessions: Sessions, redis_server: RedisServer) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        cache = VerdictCache(sessions, redis, poll_s=0.02)
        asker = Asker(Outcome(VERDICT, cacheable=True))
        await cache.get_or_ask(FP, "m", "v1", asker)
        assert await redis.get(REDIS_PREFIX + FP) is not None
        fresh = VerdictCache(sessions, redis)
        hit = await fresh.get_or_ask(FP, "m", "v1", asker)
    finally:
        await redis.delete(REDIS_PREFIX + FP)
        await redis.aclose()
    assert hit.cached
    assert asker.calls == 1
