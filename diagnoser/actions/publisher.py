"""After-commit fan-out of the outbox: wakes claim long polls, adds released actions to Redis.

The database stays the truth. The Redis Stream `diagnoser:actions` is a copy for consumer
groups: the relay adds each released action once it is committed and marks it
`published_at`, so a crash between the two re-adds it (consumers dedupe on the
idempotency key), and every replica may run the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from diagnoser.actions.kinds import ActionView
from diagnoser.store.actions import unpublished
from diagnoser.store.database import Sessions
from diagnoser.store.models import utcnow

STREAM = "diagnoser:actions"
STREAM_MAXLEN = 100_000
logger = logging.getLogger(__name__)


class ActionWake:
    """In-process wake-up of claim long polls when actions may have become claimable.

    A waiter takes a `ticket()` before it looks, then waits on it: a change between the look
    and the wait is not missed.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ticket(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    @staticmethod
    async def wait(ticket: asyncio.Event, seconds: float) -> None:
        """Until the ticket is notified, or `seconds` pass."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ticket.wait(), seconds)


class ActionPublisher:
    def __init__(self, sessions: Sessions, redis: Redis | None, wake: ActionWake) -> None:
        self.sessions = sessions
        self.redis = redis
        self.wake = wake

    async def publish(self) -> int:
        """Add every released, unpublished action to the stream; returns how many."""
        if self.redis is None:
            return 0
        async with self.sessions.begin() as session:
            rows = await unpublished(session)
            for row in rows:
                view = ActionView.model_validate(row)
                await self.redis.xadd(
                    STREAM,
                    {
                        "id": str(row.id),
                        "kind": row.kind,
                        "idempotency_key": row.idempotency_key,
                        "action": view.model_dump_json(),
                    },
                    maxlen=STREAM_MAXLEN,
                    approximate=True,
                )
                row.published_at = utcnow()
        return len(rows)

    async def run(self, interval_s: float) -> None:
        """Without Redis there is nothing to relay: claimers poll the database."""
        while self.redis is not None:
            ticket = self.wake.ticket()
            try:
                await self.publish()
            except (RedisError, SQLAlchemyError, OSError):
                logger.warning("could not publish actions to Redis; retrying", exc_info=True)
            await self.wake.wait(ticket, interval_s)
