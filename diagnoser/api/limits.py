"""Caps on what one request may carry, checked before any route runs; each answers JSON.

The log upload (`POST /v1/jobs/{job_id}/logs`) streams and has caps of its own (line length,
record bodies, gzip output: diagnoser/api/logs.py); every other body is small and read whole
here, so its size, JSON nesting and array lengths are checked before a parser sees it.
"""

from __future__ import annotations

import json

import regex
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diagnoser.api.errors import STATUS_CODES
from diagnoser.config import LimitSettings

STREAMING = regex.compile(r"^/v1/jobs/[^/]+/logs$")
"""POST here is the streaming upload, capped by its own settings."""
_OPEN = {ord("["), ord("{")}
_CLOSE = {ord("]"), ord("}")}
_QUOTE, _ESCAPE, _COMMA = ord('"'), ord("\\"), ord(",")


def json_shape_problem(body: bytes, max_depth: int, max_items: int) -> str | None:
    """Why a JSON text nests too deeply or holds too many members, or None. One pass over
    the bytes, strings skipped; malformed JSON is left to the parser to refuse."""
    depth = 0
    items: list[int] = []
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _ESCAPE:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > max_depth:
                return f"JSON nested deeper than {max_depth} levels"
            items.append(1)
        elif byte in _CLOSE:
            depth -= 1
            if items:
                items.pop()
        elif byte == _COMMA and items:
            items[-1] += 1
            if items[-1] > max_items:
                return f"a JSON array or object holds more than {max_items} members"
    return None


class LimitsMiddleware:
    """Pure ASGI: headers (431), query string (414), body size (413), JSON shape (400/413)."""

    def __init__(self, app: ASGIApp, limits: LimitSettings) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        header_bytes = sum(len(name) + len(value) for name, value in scope["headers"])
        if header_bytes > limits.max_header_bytes:
            await _refuse(send, 431, f"request headers over {limits.max_header_bytes} bytes")
            return
        if len(scope.get("query_string", b"")) > limits.max_query_bytes:
            await _refuse(send, 414, f"query string over {limits.max_query_bytes} bytes")
            return
        if scope["method"] == "POST" and STREAMING.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client left; the route will see it
            body += message.get("body", b"")
            if len(body) > limits.max_body_bytes:
                limit = limits.max_body_bytes
                await _refuse(send, 413, f"request bodies are limited to {limit} bytes")
                return
            if not message.get("more_body", False):
                break
        if body and _is_json(scope):
            problem = json_shape_problem(bytes(body), limits.max_json_depth, limits.max_json_items)
            if problem is not None:
                status = 400 if "nested" in problem else 413
                await _refuse(send, status, problem)
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return b"json" in value.lower()
    return False


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read above, once; then the real channel (a disconnect reaches the route)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(send: Send, status: int, detail: str) -> None:
    payload = json.dumps({"error": STATUS_CODES.get(status, "error"), "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
