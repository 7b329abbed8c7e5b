"""A real HTTP webhook receiver on loopback that answers from a script, for the notifier's tests.

uvicorn runs a tiny FastAPI app in a thread on a free port; every POST is recorded (path,
headers, raw body) and answered by the next step of its path's script (the last step repeats;
no script means 200). Like a receiver that honours idempotency keys, `alerts` counts distinct
`Idempotency-Key`s, so a redelivery shows up as one alert.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from tests.servers import free_port, wait_until


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: str = "ok"
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


@dataclass
class WebhookReceiver:
    scripts: dict[str, Sequence[Answer]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def alerts(self, path: str) -> set[str]:
        return {r.headers.get("idempotency-key", "") for r in self.at(path)}

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def receive(request: Request, path: str) -> Response:
            raw = await request.body()
            seen = len(self.at(f"/{path}"))
            self.received.append(Received(f"/{path}", dict(request.headers), raw))
            script = self.scripts.get(f"/{path}") or [Answer()]
            step = script[min(seen, len(script) - 1)]
            if step.delay_s:
                await asyncio.sleep(step.delay_s)
            return Response(step.body, step.status, headers=dict(step.headers))

        return app


@contextmanager
def webhook_receiver(
    scripts: Mapping[str, Sequence[Answer]] | None = None,
) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(scripts=dict(scripts or {}))
    config = uvicorn.Config(
        receiver.app(), host="127.0.0.1", port=receiver.port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "webhook receiver")
    try:
        yield receiver
    finally:
        server.should_exit = True
        thread.join(10)
