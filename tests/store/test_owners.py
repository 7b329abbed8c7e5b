"""Job leases and shared activity on real SQLite and PostgreSQL (diagnoser/store/owners.py)."""

from __future__ import annotations

from datetime import timedelta

from diagnoser.store import owners
from diagnoser.store.database import Sessions
from diagnoser.store.models import utcnow

LEASE_S = 10.0


async def claim(sessions: Sessions, replica: str, jobs: list[str], after_s: float = 0) -> set[str]:
    async with sessions.begin() as session:
        now = utcnow() + timedelta(seconds=after_s)
        return await owners.claim(session, replica, jobs, LEASE_S, now)


async def test_a_lease_is_one_replica_s_until_it_runs_out_or_is_released(
    sessions: Sessions,
) -> None:
    assert await claim(sessions, "a", ["j1", "j2"]) == {"j1", "j2"}
    assert await claim(sessions, "b", ["j1", "j2", "j3"]) == {"j3"}
    assert await claim(sessions, "a", ["j1"], after_s=LEASE_S / 2) == {"j1"}  # renewed
    # a died: j2 (not renewed) is taken once its lease ran out; j1's renewal still holds
    assert await claim(sessions, "b", ["j1", "j2"], after_s=LEASE_S + 1) == {"j2"}
    async with sessions.begin() as session:
        await owners.release(session, "a")
    assert await claim(sessions, "b", ["j1"]) == {"j1"}


async def test_the_owner_reads_the_other_replicas_activity(sessions: Sessions) -> None:
    now = utcnow()
    async with sessions.begin() as session:
        await owners.record_activity(session, "a", {"j": (now, now)}, now)
        later = now + timedelta(seconds=5)
        await owners.record_activity(session, "b", {"j": (later, None)}, now)
        await owners.record_activity(session, "c", {"j": (now, now - timedelta(seconds=9))}, now)
    async with sessions() as session:
        assert await owners.activity(session, "j", "a") == (later, now - timedelta(seconds=9))
        assert await owners.activity(session, "other", "a") == (None, None)
