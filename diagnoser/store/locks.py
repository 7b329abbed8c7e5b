"""Cross-replica locks held for one transaction: PostgreSQL advisory transaction locks.

Replicas that share a database serialise two kinds of read-then-write through them: a job's
open diagnosis (read it, correlate its stored evidence with what this replica saw, write it
back: two replicas must not both find none and create two) and the action policy (its blast
radius and budgets count recent actions: two replicas must not both count nine of ten and
both release). The lock is released by the commit or rollback, and by PostgreSQL when the
holder's connection dies, so a killed replica never leaves one behind.

SQLite has one writer: the embedded service's write gate serialises the same transactions in
its one process (docs/scale-out.md: several replicas need PostgreSQL), so there it is a no-op.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

POLICY = "diagnoser:action-policy"
"""The key of the action policy's lock: one judge at a time across replicas."""


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for a name (advisory locks take a bigint)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def hold(session: AsyncSession, name: str) -> None:
    """Wait for the lock named `name`, held until the session's transaction ends."""
    if session.get_bind().dialect.name != "postgresql":
        return
    await session.execute(select(func.pg_advisory_xact_lock(lock_key(name))))


def job(job_id: str) -> str:
    """The lock name of one job's diagnoses."""
    return f"diagnoser:job:{job_id}"
