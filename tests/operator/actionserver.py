"""A small scripted action server over real HTTP: the contract's claim, complete and extend.

It is not the service: it holds actions in memory, hands out leases, honours `depends_on` and
long polls, and lets a test script the awkward cases (a redelivery after completion, claims
that fail). Every request is recorded for assertions."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from diagnoser.operator.wire import ActionView


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ScriptedActions:
    actions: dict[int, dict[str, Any]] = field(default_factory=dict)
    completions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    extensions: list[int] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    failing_claims: int = 0
    """The next this many claims answer 503."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, view: ActionView) -> None:
        self.actions[view.id] = view.model_dump(mode="json") | {"state": "pending"}
        self.changed.set()

    def redeliver(self, action_id: int) -> None:
        """As if the completion never committed: claimable again, lease gone."""
        self.actions[action_id].update(state="pending", lease_owner=None, lease_until=None)
        self.changed.set()

    def state(self, action_id: int) -> str:
        return str(self.actions[action_id]["state"])

    def _claimable(self, action: dict[str, Any], kinds: list[str] | None) -> bool:
        if kinds is not None and action["kind"] not in kinds:
            return False
        if any(self.actions[dep]["state"] != "done" for dep in action["depends_on"]):
            return False
        if action["state"] == "pending":
            return True
        until = action.get("lease_until")
        return action["state"] == "claimed" and until is not None and until < _now().isoformat()

    async def claim(self, request: Request) -> JSONResponse:
        self.authorizations.append(request.headers.get("authorization"))
        body = await request.json()
        if self.failing_claims:
            self.failing_claims -= 1
            return JSONResponse({"error": "unavailable", "detail": "scripted"}, status_code=503)
        deadline = asyncio.get_running_loop().time() + body.get("wait_seconds", 0)
        while True:
            self.changed.clear()
            picked = [a for a in self.actions.values() if self._claimable(a, body.get("kinds"))][
                : body.get("max", 10)
            ]
            if picked:
                break
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return JSONResponse({"actions": []})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=left)
        until = _now() + timedelta(seconds=body.get("lease_seconds", 60))
        for action in picked:
            action.update(
                state="claimed",
                lease_owner=body["operator_id"],
                lease_until=until.isoformat(),
                attempts=action["attempts"] + 1,
            )
        return JSONResponse({"actions": picked})

    async def complete(self, request: Request) -> JSONResponse:
        action_id = int(request.path_params["id"])
        body = await request.json()
        self.completions.append((action_id, body))
        action = self.actions.get(action_id)
        if action is None:
            return JSONResponse({"error": "not_found", "detail": "no such action"}, 404)
        if action["state"] in {"done", "failed"} and action["status_body"] == body:
            return JSONResponse(action)  # the same completion again
        if action["lease_owner"] != body["operator_id"]:
            return JSONResponse({"error": "conflict", "detail": "lease held by another"}, 409)
        action.update(state=body["status"], result=body.get("result"), status_body=body)
        self.changed.set()
        return JSONResponse(action)

    async def extend(self, request: Request) -> JSONResponse:
        action_id = int(request.path_params["id"])
        body = await request.json()
        self.extensions.append(action_id)
        action = self.actions[action_id]
        if action["lease_owner"] != body["operator_id"] or action["state"] != "claimed":
            return JSONResponse({"error": "conflict", "detail": "lease not yours"}, 409)
        until = _now() + timedelta(seconds=body["lease_seconds"])
        action["lease_until"] = until.isoformat()
        return JSONResponse(action)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/actions/claim", self.claim, methods=["POST"]),
                Route("/v1/actions/{id:int}/complete", self.complete, methods=["POST"]),
                Route("/v1/actions/{id:int}/extend", self.extend, methods=["POST"]),
            ]
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serving(script: ScriptedActions) -> AsyncIterator[str]:
    """uvicorn on a loopback port in this event loop; yields the base URL."""
    port = _free_port()
    config = uvicorn.Config(script.app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
