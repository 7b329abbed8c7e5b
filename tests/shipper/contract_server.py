"""A test-only server for the log-upload contract the shipper codes against, run under uvicorn.

`ContractServer` is the ASGI app: one byte stream per (job, stream id); with `offset` a body is
a byte range whose whole lines are committed every `commit_every_bytes` and at its end (a
trailing partial line is not committed; what arrived since the last commit is lost if the
client disconnects, harsher than the real server); without `offset` the body is whole lines,
an unterminated last one included. Resent bytes are deduplicated, an offset past the committed
one gets 409 offset_gap, a second request on a busy stream 429, a bad bearer token 401; switches
answer 503 + Retry-After, report a wrong committed offset, or commit a cut upload's whole lines
late: just after the client's next read of the offset has been answered (a replica that
finishes a cut upload after the client resynced, perhaps with another replica).

`CuttingProxy` sits in front of any server and cuts connections after a number of uploaded
bytes: a real disconnect mid-request, which an ASGI app cannot cause itself.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.servers import free_port, wait_until


@dataclass
class Faults:
    fail_count: int = 0
    fail_status: int = 503
    retry_after: str = "0"
    skew_count: int = 0
    skew_bytes: int = 0
    late_commits: bool = False


def _error(status: int, code: str, detail: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **extra}, status_code=status)


@dataclass
class StoredStream:
    data: bytearray = field(default_factory=bytearray)
    lines: int = 0


@dataclass
class ContractServer:
    token: str | None = None
    commit_every_bytes: int = 16 * 1024
    busy_retry_after: str = "0.05"
    streams: dict[tuple[str, str], StoredStream] = field(default_factory=dict)
    busy: set[tuple[str, str]] = field(default_factory=set)
    faults: Faults = field(default_factory=Faults)
    posts: int = 0
    disconnects: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    late: dict[tuple[str, str], list[_Upload]] = field(default_factory=dict)
    """Cut uploads whose whole lines land after the next GET of their stream."""
    opened: list[tuple[str, float]] = field(default_factory=list)
    """Each POST's stream and when it arrived (monotonic clock)."""

    def __post_init__(self) -> None:
        route = Route("/v1/jobs/{job}/logs", self.logs, methods=["GET", "POST"])
        self.app = Starlette(routes=[route])

    def fail_next(self, count: int, *, status: int = 503, retry_after: str = "0") -> None:
        """The next `count` POSTs get `status` with this Retry-After, their bodies unread."""
        with self.lock:
            self.faults.fail_count, self.faults.fail_status = count, status
            self.faults.retry_after = retry_after

    def skew_next_gets(self, count: int, by: int) -> None:
        """The next `count` GETs report the committed offset `by` bytes too high (a stale read)."""
        with self.lock:
            self.faults.skew_count, self.faults.skew_bytes = count, by

    def commit_cut_uploads_late(self) -> None:
        """From now on an upload commits at its end only, and one that is cut commits its
        whole lines just after the next GET of its stream has read the offset: that reply,
        and the receipt of the upload resent from it, both leave those lines out."""
        with self.lock:
            self.faults.late_commits = True

    def content(self, job: str, stream: str) -> bytes:
        with self.lock:
            stored = self.streams.get((job, stream))
            return b"" if stored is None else bytes(stored.data)

    async def logs(self, request: Request) -> Response:
        if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "unauthorized", "missing or bad bearer token")
        query = request.query_params
        node = query.get("node")
        if not node:
            return _error(422, "invalid_request", "node is required")
        stream = query.get("stream") or (f"{node}/{query['rank']}" if "rank" in query else node)
        key = (request.path_params["job"], stream)
        if request.method == "GET":
            return self._state(key, node, query.get("rank"))
        return await self._upload(request, key, query.get("offset"))

    def _state(self, key: tuple[str, str], node: str, rank: str | None) -> Response:
        with self.lock:
            if key not in self.streams:
                return _error(404, "stream_not_found", f"no stream {key[1]!r} in job {key[0]!r}")
            stored = self.streams[key]
            committed, lines = len(stored.data), stored.lines
            if self.faults.skew_count:
                self.faults.skew_count -= 1
                committed += self.faults.skew_bytes
            late = self.late.pop(key, [])
        for upload in late:
            upload.commit(whole_lines_only=True)
        return JSONResponse(
            {
                "job_id": key[0],
                "stream": key[1],
                "node": node,
                "rank": None if rank is None else int(rank),
                "committed_offset": committed,
                "lines": lines,
            }
        )

    async def _upload(self, request: Request, key: tuple[str, str], raw: str | None) -> Response:
        with self.lock:
            self.posts += 1
            self.opened.append((key[1], time.monotonic()))
            if self.faults.fail_count:
                self.faults.fail_count -= 1
                status = self.faults.fail_status
                response = _error(status, "unavailable", "injected failure")
                response.headers["Retry-After"] = self.faults.retry_after
                return response
            if key in self.busy:
                response = _error(429, "stream_busy", "another request is writing this stream")
                response.headers["Retry-After"] = self.busy_retry_after
                return response
            committed = len(self.streams.get(key, StoredStream()).data)
            if raw is not None and not raw.isdigit():
                return _error(422, "invalid_request", "offset must be a number")
            offset = committed if raw is None else int(raw)
            if offset > committed:
                detail = "offset beyond the committed one"
                return _error(409, "offset_gap", detail, expected_offset=committed)
            self.busy.add(key)
        try:
            upload = _Upload(self, key, offset)
            late_commits = self.faults.late_commits  # a whole upload's lines wait, if cut
            try:
                async for chunk in request.stream():
                    upload.pending += chunk
                    if len(upload.pending) >= self.commit_every_bytes and not late_commits:
                        upload.commit(whole_lines_only=True)
            except ClientDisconnect:
                with self.lock:
                    self.disconnects += 1
                    if self.faults.late_commits:
                        self.late.setdefault(key, []).append(upload)
                return Response(status_code=499)
            upload.commit(whole_lines_only=raw is not None)
            with self.lock:
                stored = self.streams.get(key, StoredStream())
                next_offset, stream_lines = len(stored.data), stored.lines
        finally:
            with self.lock:
                self.busy.discard(key)
        return JSONResponse(
            {
                "lines_accepted": upload.lines,
                "duplicate_bytes": upload.duplicate,
                "next_offset": next_offset,
                "stream_lines": stream_lines,
            }
        )


@dataclass
class _Upload:
    """One request's bytes at stream offset `at`, committed into the stream in steps."""

    server: ContractServer
    key: tuple[str, str]
    at: int
    pending: bytearray = field(default_factory=bytearray)
    lines: int = 0
    duplicate: int = 0

    def commit(self, *, whole_lines_only: bool) -> None:
        cut = self.pending.rfind(b"\n") + 1 if whole_lines_only else len(self.pending)
        data = bytes(self.pending[:cut])
        del self.pending[:cut]
        with self.server.lock:
            stored = self.server.streams.setdefault(self.key, StoredStream())
            skip = len(stored.data) - self.at
            fresh = data[skip:]
            stored.data += fresh
            lines = fresh.count(b"\n") + (1 if fresh and not fresh.endswith(b"\n") else 0)
            stored.lines += lines
        self.at += len(data)
        self.lines += lines
        self.duplicate += min(skip, len(data))


class UvicornThread:
    """Real uvicorn serving an ASGI app on a free loopback port, in a background thread."""

    def __init__(self, app: Starlette) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="error",
            lifespan="off",
            http="h11",
            ws="none",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_until(lambda: self.server.started, 10, "uvicorn")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class CuttingProxy:
    """A loopback TCP proxy that can reset client connections after some uploaded bytes.

    `cut_after(n, times)` arms it: once `n` more bytes have gone from clients to the server,
    the connection carrying them is reset (the server sees a disconnect mid-body, the client a
    dead socket), and it re-arms until it has cut `times` connections.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.cuts = 0
        self._budget: int | None = None
        self._every = 0
        self._times = 0
        self._lock = threading.Lock()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_after(self, nbytes: int, times: int = 1) -> None:
        with self._lock:
            self._budget, self._every, self._times = nbytes, nbytes, times

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        for thread in self._threads:
            thread.join(5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                readable, _, _ = select.select([self.listener], [], [], 0.1)
            except (OSError, ValueError):
                # close() shut the listener between the loop's check and the select.
                return
            if not readable or self._closing:
                continue
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()  # upstream down: refuse, as the server itself would
                continue
            self._spawn(self._pump, client, upstream)

    def _allowance(self, wanted: int) -> tuple[int, bool]:
        """How many of `wanted` client bytes may pass, and whether to cut after them."""
        with self._lock:
            if self._budget is None:
                return wanted, False
            if wanted < self._budget:
                self._budget -= wanted
                return wanted, False
            allowed = self._budget
            self.cuts += 1
            self._times -= 1
            self._budget = self._every if self._times > 0 else None
            return allowed, True

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        sockets: Iterable[socket.socket] = (client, upstream)
        try:
            while not self._closing:
                readable, _, _ = select.select(list(sockets), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is upstream:
                        client.sendall(data)
                        continue
                    allowed, cut = self._allowance(len(data))
                    upstream.sendall(data[:allowed])
                    if cut:
                        reset = struct.pack("ii", 1, 0)  # close with RST, as a crash would
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
                        return
        except OSError:
            return
        finally:
            client.close()
            upstream.close()
