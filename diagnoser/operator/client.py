"""The operator's HTTP client of the service's action API (claim, complete, extend).

Claims are long polls: the request waits up to `wait_seconds` on the server, so its read timeout
is that plus a margin. A bearer token (`--token`, `DIAGNOSER_TOKEN`) is sent on every request when
given; the service ignores it until authentication is built."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx
from pydantic import ValidationError

from diagnoser.operator.wire import (
    ActionView,
    ClaimRequest,
    ClaimResponse,
    CompleteRequest,
    ExtendRequest,
)

TIMEOUT_MARGIN = 10.0


class ActionApiError(Exception):
    """An answer the operator cannot act on; `status` 0 when no answer came at all."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail

    @property
    def retryable(self) -> bool:
        return self.status in {0, 429} or self.status >= 500


class LeaseLostError(ActionApiError):
    """409: another operator holds the action's lease now (ours expired)."""


class ActionNotFoundError(ActionApiError):
    """404: the service does not know the action (deleted, or a different database)."""


class ActionClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> ActionClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def claim(self, request: ClaimRequest) -> list[ActionView]:
        poll = httpx.Timeout(self._timeout, read=request.wait_seconds + TIMEOUT_MARGIN)
        body = await self._post(
            "/v1/actions/claim", request.model_dump(mode="json", exclude_none=True), poll
        )
        try:
            return ClaimResponse.model_validate(body).actions
        except ValidationError as exc:
            raise ActionApiError(0, f"unreadable claim answer: {exc.error_count()} errors") from exc

    async def complete(self, action_id: int, request: CompleteRequest) -> ActionView:
        body = await self._post(
            f"/v1/actions/{action_id}/complete", request.model_dump(mode="json", exclude_none=True)
        )
        return ActionView.model_validate(body)

    async def extend(self, action_id: int, request: ExtendRequest) -> ActionView:
        body = await self._post(
            f"/v1/actions/{action_id}/extend", request.model_dump(mode="json", exclude_none=True)
        )
        return ActionView.model_validate(body)

    async def _post(
        self, path: str, payload: dict[str, Any], poll: httpx.Timeout | None = None
    ) -> Any:
        try:
            if poll is None:
                response = await self._http.post(path, json=payload)
            else:
                response = await self._http.post(path, json=payload, timeout=poll)
        except httpx.HTTPError as exc:
            raise ActionApiError(0, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 409:
            raise LeaseLostError(409, _detail(response))
        if response.status_code == 404:
            raise ActionNotFoundError(404, _detail(response))
        if response.is_error:
            raise ActionApiError(response.status_code, _detail(response))
        return response.json()


def _detail(response: httpx.Response) -> str:
    """The service's error body says `detail`; anything else is shown cut short."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return str(body)[:200]
