"""Verdicts cached by fingerprint, with a single flight across tasks and replicas.

A 512-rank storm yields one trace and so one question: it must cost one round of k calls,
however many diagnoses, workers or replicas ask it. In-process, concurrent askers of one
fingerprint share one task. Across replicas the database row is the flight: whoever inserts the
`pending` row asks; the others poll until it is `done`, or take it over once its lease runs out
(the asker died). With Redis configured, answered verdicts are also kept there and read first,
so a hot fingerprint costs no database read. A failed ask is released, never cached.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from diagnoser.store.database import Sessions
from diagnoser.store.escalations import Claim, claim_verdict, release_claim, store_verdict

logger = logging.getLogger(__name__)

REDIS_PREFIX = "diagnoser:llm:verdict:"


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: dict[str, Any]
    cacheable: bool
    """False when the LLM could not be reached: such a verdict is not the model's answer."""


@dataclass(frozen=True, slots=True)
class Cached:
    verdict: dict[str, Any]
    cached: bool
    """True when no call was made for this request (answered before, or by another asker)."""


class VerdictCache:
    def __init__(
        self,
        sessions: Sessions,
        redis: Redis | None = None,
        *,
        lease_s: float = 300.0,
        poll_s: float = 0.5,
        redis_ttl_s: int = 7 * 24 * 3600,
    ) -> None:
        self.sessions = sessions
        self.redis = redis
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.redis_ttl_s = redis_ttl_s
        self._flights: dict[str, asyncio.Future[Cached]] = {}

    async def get_or_ask(
        self,
        fingerprint: str,
        model: str,
        prompt_version: str,
        ask: Callable[[], Awaitable[Outcome]],
    ) -> Cached:
        flight = self._flights.get(fingerprint)
        if flight is not None:
            shared = await asyncio.shield(flight)
            return Cached(shared.verdict, cached=True)
        future: asyncio.Future[Cached] = asyncio.get_running_loop().create_future()
        self._flights[fingerprint] = future
        try:
            result = await self._resolve(fingerprint, model, prompt_version, ask)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._flights[fingerprint]

    async def _resolve(
        self,
        fingerprint: str,
        model: str,
        prompt_version: str,
        ask: Callable[[], Awaitable[Outcome]],
    ) -> Cached:
        hit = await self._redis_get(fingerprint)
        if hit is not None:
            return Cached(hit, cached=True)
        while True:
            async with self.sessions.begin() as session:
                claim, verdict = await claim_verdict(
                    session, fingerprint, model, prompt_version, self.lease_s
                )
            if claim is Claim.DONE and verdict is not None:
                await self._redis_put(fingerprint, verdict)
                return Cached(verdict, cached=True)
            if claim is Claim.MINE:
                break
            await asyncio.sleep(self.poll_s)
        try:
            outcome = await ask()
        except BaseException:
            await self._release(fingerprint)
            raise
        if not outcome.cacheable:
            await self._release(fingerprint)
            return Cached(outcome.verdict, cached=False)
        async with self.sessions.begin() as session:
            await store_verdict(session, fingerprint, outcome.verdict)
        await self._redis_put(fingerprint, outcome.verdict)
        return Cached(outcome.verdict, cached=False)

    async def _release(self, fingerprint: str) -> None:
        try:
            async with self.sessions.begin() as session:
                await release_claim(session, fingerprint)
        except Exception:  # the lease runs out by itself; another asker takes it over then
            logger.exception("could not release LLM claim %s", fingerprint[:12])

    async def _redis_get(self, fingerprint: str) -> dict[str, Any] | None:
        if self.redis is None:
            return None
        try:
            raw = await self.redis.get(REDIS_PREFIX + fingerprint)
        except RedisError:
            return None  # Redis is an accelerator; the database answers without it
        if raw is None:
            return None
        value = json.loads(raw)
        return value if isinstance(value, dict) else None

    async def _redis_put(self, fingerprint: str, verdict: dict[str, Any]) -> None:
        if self.redis is None:
            return
        try:
            await self.redis.set(
                REDIS_PREFIX + fingerprint, json.dumps(verdict), ex=self.redis_ttl_s
            )
        except RedisError:
            logger.warning("Redis unavailable: LLM verdict cached in the database only")
