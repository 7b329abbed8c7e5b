"""What waits in the database: pending escalations and actions no operator has finished.

Read when Prometheus scrapes `/metrics`. The rows are shared by every replica, so each one
reports the same numbers: dashboards and alerts take `max()` over replicas, not `sum()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.actions.kinds import ActionState
from diagnoser.store.models import ActionRow, EscalationRow, utcnow


@dataclass(frozen=True, slots=True)
class Backlog:
    escalations_pending: int = 0
    """Escalations the LLM stage has not answered yet (waiting out the quiet window, queued,
    or being asked)."""
    oldest_escalation_s: float = 0.0
    """Age of the oldest pending escalation (0: none)."""
    actions_unclaimed: int = 0
    """Released actions an operator could claim now and has not."""
    oldest_unclaimed_action_s: float = 0.0
    """How long the oldest of them has been claimable (0: none)."""
    actions_lease_expired: int = 0
    """Actions claimed whose lease ran out without a completion: the operator died or hangs."""


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


async def measure(session: AsyncSession) -> Backlog:
    """Three indexed aggregate reads (state is indexed on both tables)."""
    now = utcnow()
    escalations = (
        await session.execute(
            select(func.count(), func.min(EscalationRow.created_at)).where(
                EscalationRow.state == "pending"
            )
        )
    ).one()
    claimable = (
        await session.execute(
            select(func.count(), func.min(ActionRow.released_at)).where(
                ActionRow.state == ActionState.PENDING.value,
                ActionRow.released_at.is_not(None),
                or_(ActionRow.not_before.is_(None), ActionRow.not_before <= now),
                or_(ActionRow.expires_at.is_(None), ActionRow.expires_at > now),
            )
        )
    ).one()
    lapsed = await session.scalar(
        select(func.count()).where(
            and_(ActionRow.state == ActionState.CLAIMED.value, ActionRow.lease_until < now)
        )
    )
    return Backlog(
        escalations_pending=int(escalations[0]),
        oldest_escalation_s=_age(now, escalations[1]),
        actions_unclaimed=int(claimable[0]),
        oldest_unclaimed_action_s=_age(now, claimable[1]),
        actions_lease_expired=int(lapsed or 0),
    )
