"""An in-memory `ActionQueue`: the outbox's claim/lease/complete rules on a dict, for tests.

It keeps the contract's semantics that the notifier relies on: a claim leases `pending`
actions (and `claimed` ones whose lease has run out) and counts an attempt; completing twice
is a no-op; the clock is explicit, so a lease runs out when a test says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from diagnoser.actions.notify_wire import ActionView, Decision

FINAL_STATES = frozenset({"done", "failed", "suppressed", "expired", "cancelled"})


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: datetime(2026, 12, 1, 12, 0, tzinfo=UTC))

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class MemoryQueue:
    actions: dict[int, ActionView]
    clock: Clock = field(default_factory=Clock)
    operator_id: str = "notifier"
    claims: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False)
    """Notified on every claim and completion, for tests that wait on a running worker."""

    async def wait_until(self, predicate: Callable[[MemoryQueue], bool]) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: predicate(self))

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def claim(self, kinds: Sequence[str], max: int, lease_seconds: int) -> list[ActionView]:
        self.claims += 1
        now = self.clock.now
        out: list[ActionView] = []
        for action_id in sorted(self.actions):
            action = self.actions[action_id]
            lapsed = action.state == "claimed" and (action.lease_until or now) <= now
            if action.kind not in kinds or not (action.state == "pending" or lapsed):
                continue
            claimed = action.model_copy(
                update={
                    "state": "claimed",
                    "lease_owner": self.operator_id,
                    "lease_until": now + timedelta(seconds=lease_seconds),
                    "attempts": action.attempts + 1,
                    "updated_at": now,
                }
            )
            self.actions[action_id] = claimed
            out.append(claimed)
            if len(out) == max:
                break
        await self._notify()
        return out

    async def complete(
        self, id: int, status: str, message: str, result: dict[str, Any] | None
    ) -> ActionView:
        action = self.actions[id]
        if action.state in FINAL_STATES:
            return action
        if status not in {"done", "failed"}:
            raise ValueError(f"status {status!r}")
        now = self.clock.now
        done = action.model_copy(
            update={
                "state": status,
                "result": result,
                "lease_owner": None,
                "lease_until": None,
                "updated_at": now,
                "decisions": [*action.decisions, Decision(at=now, decision=status, reason=message)],
            }
        )
        self.actions[id] = done
        await self._notify()
        return done
