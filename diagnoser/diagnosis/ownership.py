"""Job ownership across replicas: one hang detector per job, passed on within seconds.

Replicas behind one Service get the streams of a job wherever the load balancer sends them.
Diagnoses need no owner (each replica correlates its events with the stored diagnosis under a
per-job database lock), but a stall is a fact about the whole job, and only one replica
should decide that a job is hung. Every `lease_s / 3` each replica, in one transaction:

- writes its newest line and step advance of every job whose activity changed (the owner
  reads the others' before it calls a stall a hang);
- renews its leases on the jobs it holds live state for, and takes those whose lease ran out.

A replica that dies stops renewing: a survivor holding streams of the job (the shippers
reconnect to it) takes the job within `lease_s`. One that stops cleanly releases its leases,
so a rolling restart hands jobs over at the survivors' next round. A replica that cannot
reach the database stops counting itself an owner when its last renewal runs out.

The embedded default (one process, SQLite) owns every job it sees; nothing changes for it.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import anyio

from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.store import owners
from diagnoser.store.database import Sessions
from diagnoser.store.models import utcnow

logger = logging.getLogger(__name__)

DEFAULT_LEASE_S = 10.0


def _time(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


class JobOwnership:
    def __init__(
        self,
        sessions: Sessions,
        stage: DiagnosisStage,
        replica: str,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.sessions = sessions
        self.stage = stage
        self.replica = replica
        self.lease_s = lease_s
        self.owned: frozenset[str] = frozenset()
        self._valid_until = 0.0
        """Monotonic time the last renewal holds until (taken before its transaction)."""

    def owns(self, job_id: str) -> bool:
        return job_id in self.owned and time.monotonic() < self._valid_until

    async def renew(self) -> frozenset[str]:
        """One round: share this replica's activity, renew and take leases."""
        started = time.monotonic()
        jobs = list(self.stage.jobs)
        shared = self.stage.take_activity()
        activity = {
            job_id: (datetime.fromtimestamp(line_at, UTC), _time(step_at))
            for job_id, (line_at, step_at) in shared.items()
        }
        now = utcnow()
        try:
            async with self.sessions.begin() as session:
                await owners.record_activity(session, self.replica, activity, now)
                claimed = await owners.claim(session, self.replica, jobs, self.lease_s, now)
        except BaseException:
            self.stage.unshare(shared)  # told again next round
            raise
        self.owned = frozenset(claimed)
        self._valid_until = started + self.lease_s
        return self.owned

    async def remote(self, job_id: str) -> None:
        """Merge what the other replicas saw of the job into its live state here."""
        async with self.sessions() as session:
            line_at, step_at = await owners.activity(session, job_id, self.replica)
        if line_at is not None:
            self.stage.merge_remote(
                job_id, line_at.timestamp(), None if step_at is None else step_at.timestamp()
            )

    async def run(self) -> None:
        """Renew every third of the lease, forever; a failed round is retried at the next."""
        while True:
            try:
                await self.renew()
            except Exception:
                logger.warning("job ownership round failed; retrying", exc_info=True)
            await anyio.sleep(self.lease_s / 3)

    async def release(self) -> None:
        """On a clean stop: hand every job over at the survivors' next round."""
        self.owned = frozenset()
        async with self.sessions.begin() as session:
            await owners.release(session, self.replica)
