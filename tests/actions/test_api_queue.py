"""The notify worker over HTTP: the operator API's claim/complete routes on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from diagnoser.actions.api_queue import ApiActionQueue
from diagnoser.actions.notifier import NotifyWorker
from diagnoser.config import NotifySettings
from tests.actions.memory_queue import MemoryQueue
from tests.actions.samples import notify_action
from tests.actions.webhook_receiver import WebhookReceiver, webhook_receiver
from tests.servers import free_port, wait_until


class Claim(BaseModel):
    operator_id: str
    kinds: list[str]
    max: int
    lease_seconds: int
    wait_seconds: int


class Complete(BaseModel):
    operator_id: str
    status: str
    message: str
    result: dict[str, Any] | None = None


def contract_app(queue: MemoryQueue) -> FastAPI:
    """The two routes of the operator API the notifier uses, over an in-memory outbox."""
    app = FastAPI()

    @app.post("/v1/actions/claim")
    async def claim(body: Claim) -> JSONResponse:
        queue.operator_id = body.operator_id
        actions = await queue.claim(body.kinds, body.max, body.lease_seconds)
        return JSONResponse({"actions": [a.model_dump(mode="json") for a in actions]})

    @app.post("/v1/actions/{action_id}/complete")
    async def complete(action_id: int, body: Complete) -> JSONResponse:
        action = queue.actions.get(action_id)
        if action is None:
            return JSONResponse({"detail": "unknown action"}, 404)
        if action.state == "claimed" and action.lease_owner != body.operator_id:
            return JSONResponse({"detail": "lease held by another operator"}, 409)
        done = await queue.complete(action_id, body.status, body.message, body.result)
        return JSONResponse(done.model_dump(mode="json"))

    return app


@pytest.fixture
def service() -> Iterator[tuple[str, MemoryQueue]]:
    queue = MemoryQueue({1: notify_action(1), 2: notify_action(2)})
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(contract_app(queue), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "operator API")
    try:
        yield f"http://127.0.0.1:{port}/", queue
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as r:
        yield r


async def test_the_worker_claims_and_completes_over_http(
    service: tuple[str, MemoryQueue], receiver: WebhookReceiver
) -> None:
    url, queue = service
    settings = NotifySettings.model_validate(
        {"destinations": [{"name": "hook", "url": receiver.url("/hook")}]}
    )
    async with httpx.AsyncClient() as client:
        api = ApiActionQueue(client, url, "notifier-a")
        assert await NotifyWorker(api, settings, client=client).run_once() == 2
    assert {a.state for a in queue.actions.values()} == {"done"}
    assert queue.actions[1].result is not None
    assert queue.actions[1].result["destinations"][0]["outcome"] == "delivered"
    assert len(receiver.at("/hook")) == 2


async def test_a_lost_lease_is_not_an_error(service: tuple[str, MemoryQueue]) -> None:
    url, queue = service
    async with httpx.AsyncClient() as client:
        a = ApiActionQueue(client, url, "notifier-a")
        b = ApiActionQueue(client, url, "notifier-b")
        (first, _) = await a.claim(["notify"], 10, 60)
        queue.clock.advance(61)
        (again, _) = await b.claim(["notify"], 10, 60)
        assert again.id == first.id
        assert await a.complete(first.id, "done", "late", None) is None
        view = await b.complete(again.id, "done", "delivered", {"destinations": []})
        assert view is not None
        assert view.state == "done"
        assert (await b.complete(again.id, "done", "delivered", None)) == view  # idempotent
