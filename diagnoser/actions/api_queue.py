"""The operator API as an `ActionQueue`, for a notifier that runs outside the service.

`POST /v1/actions/claim` and `POST /v1/actions/{id}/complete`, as the operator contract
defines them. A completion refused with 409 means the lease ran out and another consumer holds
the action now: that one will deliver it (same idempotency key), so it is logged, not raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx

from diagnoser.actions.notify_wire import ActionView

log = logging.getLogger(__name__)


class ApiActionQueue:
    def __init__(
        self,
        client: httpx.AsyncClient,
        server: str,
        operator_id: str,
        *,
        wait_seconds: int = 0,
    ) -> None:
        """`wait_seconds` (0..30) makes each claim a long poll; the client's read timeout must
        be longer than it."""
        self._client = client
        self._server = server.rstrip("/")
        self._operator_id = operator_id
        self._wait_seconds = wait_seconds

    async def claim(self, kinds: Sequence[str], max: int, lease_seconds: int) -> list[ActionView]:
        response = await self._client.post(
            f"{self._server}/v1/actions/claim",
            json={
                "operator_id": self._operator_id,
                "kinds": list(kinds),
                "max": max,
                "lease_seconds": lease_seconds,
                "wait_seconds": self._wait_seconds,
            },
        )
        response.raise_for_status()
        return [ActionView.model_validate(a) for a in response.json()["actions"]]

    async def complete(
        self, id: int, status: str, message: str, result: dict[str, Any] | None
    ) -> ActionView | None:
        body: dict[str, Any] = {
            "operator_id": self._operator_id,
            "status": status,
            "message": message,
        }
        if result is not None:
            body["result"] = result
        response = await self._client.post(f"{self._server}/v1/actions/{id}/complete", json=body)
        if response.status_code == 409:
            log.warning("notify action %d: lease lost before completion; another holds it", id)
            return None
        response.raise_for_status()
        return ActionView.model_validate(response.json())
