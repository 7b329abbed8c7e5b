"""A real OpenAI-compatible HTTP server that answers from a script, for exact LLM cases.

It runs uvicorn in a thread on a free loopback port, so the real `openai` client path runs: HTTP,
JSON, status codes, timeouts. Each chat completion takes the next step of the script (the last
step repeats); every request body is recorded for assertions.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.servers import free_port, wait_until


@dataclass(frozen=True)
class Reply:
    """Answer 200 with this message content (a dict is sent as its JSON)."""

    content: str | dict[str, Any]
    delay_s: float = 0.0


@dataclass(frozen=True)
class Fail:
    status: int
    delay_s: float = 0.0


@dataclass(frozen=True)
class Held:
    """Hold the request until the test sets `release` (an endpoint that hangs), then answer
    `then`. Bounded by `max_wait_s`, so a failed test cannot hang the server."""

    release: threading.Event
    then: Reply | Fail
    max_wait_s: float = 120.0


Step = Reply | Fail | Held | Callable[[dict[str, Any]], "Reply | Fail"]


@dataclass
class ScriptedLlm:
    script: Sequence[Step]
    rejects_json_schema: bool = False
    """Answer 400 to `response_format: json_schema`, as servers without it do."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    answered: int = 0
    """Completions answered so far (a held one counts once it is released)."""
    port: int = field(default_factory=free_port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def completions(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

    def _next(self, body: dict[str, Any]) -> Reply | Fail | Held:
        index = min(len(self.completions) - 1, len(self.script) - 1)
        step = self.script[index]
        return step(body) if callable(step) else step

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            self.requests.append(body)
            fmt = (body.get("response_format") or {}).get("type")
            if self.rejects_json_schema and fmt == "json_schema":
                return JSONResponse({"error": {"message": "json_schema unsupported"}}, 400)
            step = self._next(body)
            if isinstance(step, Held):
                await asyncio.to_thread(step.release.wait, step.max_wait_s)
                step = step.then
            if step.delay_s:
                await asyncio.sleep(step.delay_s)
            self.answered += 1
            if isinstance(step, Fail):
                return JSONResponse({"error": {"message": "scripted failure"}}, step.status)
            content = step.content if isinstance(step.content, str) else json.dumps(step.content)
            return JSONResponse(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                }
            )

        return app


@contextmanager
def scripted_llm(script: Sequence[Step], **options: Any) -> Iterator[ScriptedLlm]:
    llm = ScriptedLlm(script=script, **options)
    config = uvicorn.Config(llm.app(), host="127.0.0.1", port=llm.port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "scripted LLM server")
    try:
        yield llm
    finally:
        server.should_exit = True
        thread.join(10)
