"""Job ownership leases and each replica's share of a job's activity (job_owners, job_activity).

The clock is the replicas' own (`now`, UTC): leases last seconds, so clocks kept within a
second of each other (NTP, as every Kubernetes node keeps them) do not matter.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import case, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.store.models import JobActivityRow, JobOwnerRow

BATCH = 500
"""Jobs per statement: bounded parameter lists on both backends."""
T = TypeVar("T")


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


def _insert(session: AsyncSession) -> Any:
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


async def claim(
    session: AsyncSession, replica: str, job_ids: Collection[str], lease_s: float, now: datetime
) -> set[str]:
    """Renew this replica's leases on `job_ids` and take those that are free or ran out;
    returns the jobs it owns now. The rest are another live replica's."""
    insert = _insert(session)
    until = now + timedelta(seconds=lease_s)
    owned: set[str] = set()
    for batch in _batches(sorted(job_ids)):
        statement = insert(JobOwnerRow).values(
            [{"job_id": j, "owner": replica, "lease_until": until, "taken_at": now} for j in batch]
        )
        taken = statement.excluded
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=[JobOwnerRow.job_id],
                set_={
                    "owner": taken.owner,
                    "lease_until": taken.lease_until,
                    # a renewal keeps when the lease was taken; a take-over starts it again
                    "taken_at": case(
                        (JobOwnerRow.owner == replica, JobOwnerRow.taken_at), else_=taken.taken_at
                    ),
                },
                where=(JobOwnerRow.owner == replica) | (JobOwnerRow.lease_until < now),
            )
        )
        rows = await session.scalars(
            select(JobOwnerRow.job_id).where(
                JobOwnerRow.job_id.in_(batch), JobOwnerRow.owner == replica
            )
        )
        owned.update(rows)
    return owned


async def release(session: AsyncSession, replica: str) -> None:
    """Give every lease of this replica up (a clean stop): survivors take them at their next
    round instead of waiting for the leases to run out."""
    await session.execute(delete(JobOwnerRow).where(JobOwnerRow.owner == replica))


async def record_activity(
    session: AsyncSession,
    replica: str,
    activity: Mapping[str, tuple[datetime, datetime | None]],
    now: datetime,
) -> None:
    """This replica's newest line and step advance per job (only the jobs that changed)."""
    insert = _insert(session)
    for batch in _batches(sorted(activity)):
        values = [
            {
                "job_id": job_id,
                "replica": replica,
                "last_line_at": activity[job_id][0],
                "last_step_at": activity[job_id][1],
                "updated_at": now,
            }
            for job_id in batch
        ]
        statement = insert(JobActivityRow).values(values)
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=[JobActivityRow.job_id, JobActivityRow.replica],
                set_={
                    "last_line_at": statement.excluded.last_line_at,
                    "last_step_at": statement.excluded.last_step_at,
                    "updated_at": statement.excluded.updated_at,
                },
            )
        )


async def activity(
    session: AsyncSession, job_id: str, replica: str
) -> tuple[datetime | None, datetime | None]:
    """The job's newest line and step advance on every replica but this one."""
    row = (
        await session.execute(
            select(
                func.max(JobActivityRow.last_line_at), func.max(JobActivityRow.last_step_at)
            ).where(JobActivityRow.job_id == job_id, JobActivityRow.replica != replica)
        )
    ).one()
    return row[0], row[1]


async def owner_of(session: AsyncSession, job_id: str) -> JobOwnerRow | None:
    row: JobOwnerRow | None = await session.get(JobOwnerRow, job_id, populate_existing=True)
    return row
