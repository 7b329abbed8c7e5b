"""The built-in notifier's queue inside the service: the outbox itself, with no HTTP hop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from diagnoser.actions.kinds import ActionKind
from diagnoser.actions.kinds import ActionView as StoredView
from diagnoser.actions.notify_wire import ActionView
from diagnoser.actions.policy import PolicyConfig
from diagnoser.store import actions as outbox
from diagnoser.store.database import Sessions

NOTIFIER_ID = "diagnoser-notifier"
"""The lease owner the service's own notifier claims `notify` actions as."""


class StoreActionQueue:
    """`ActionQueue` (diagnoser/actions/notifier.py) over the outbox tables.

    Claims and completions take the same paths as an operator's (leases, idempotency, the
    actions a completion releases), and wake long-polling claimers after each commit.
    """

    def __init__(
        self,
        sessions: Sessions,
        policy: PolicyConfig,
        max_attempts: int,
        wake: Callable[[], None],
    ) -> None:
        self._sessions = sessions
        self._policy = policy
        self._max_attempts = max_attempts
        self._wake = wake

    async def claim(self, kinds: Sequence[str], max: int, lease_seconds: int) -> list[ActionView]:
        async with self._sessions.begin() as session:
            rows = await outbox.claim(
                session,
                NOTIFIER_ID,
                [ActionKind(kind) for kind in kinds],
                max,
                timedelta(seconds=lease_seconds),
                self._max_attempts,
            )
            views = [StoredView.model_validate(row).model_dump(mode="json") for row in rows]
        if views:
            self._wake()
        return [ActionView.model_validate(view) for view in views]

    async def complete(
        self, id: int, status: str, message: str, result: dict[str, Any] | None
    ) -> object:
        async with self._sessions.begin() as session:
            completion = await outbox.complete(
                session, id, NOTIFIER_ID, status, message, result, self._policy
            )
            view = StoredView.model_validate(completion.action)
        self._wake()
        return view
