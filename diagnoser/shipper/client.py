"""The upload loop: stream a source to the server in long-lived chunked POSTs, and resume.

Every request starts at the offset the server last reported as committed, so a resend is always
safe (the server drops bytes it already has) and nothing is skipped. One request carries at most
`max_request_bytes` or lasts at most `max_request_seconds`, whichever comes first, so the server
commits regularly; it opens only when there is something to send.

After any failure (connection error, timeout, 408/429/5xx) the loop waits (exponential backoff
with jitter, or the server's Retry-After), asks the server for its committed offset again (GET)
and seeks the source back there. A 409 offset_gap seeks to the `expected_offset` it names.
401/403 and other client errors are final (`ShipError`, with the exit code for the CLI).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import NoReturn, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from diagnoser.shipper.follow import CHUNK_BYTES
from diagnoser.shipper.progress import Progress
from diagnoser.shipper.retry import Backoff, parse_retry_after
from diagnoser.shipper.schemas import ErrorReply, StreamState, UploadReceipt

TEXT = {"Content-Type": "text/plain"}


class ExitCode(IntEnum):
    OK = 0
    REJECTED = 1
    USAGE = 2
    AUTH = 3


class ShipError(Exception):
    """A failure that retrying will not fix: one line for the operator, and an exit code."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _RetryableError(Exception):
    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _OffsetGapError(Exception):
    def __init__(self, expected_offset: int) -> None:
        super().__init__(f"server expects offset {expected_offset}")
        self.expected_offset = expected_offset


class Source(Protocol):
    """A byte stream at stream offsets that can be re-read from the server's committed offset."""

    @property
    def offset(self) -> int: ...

    @property
    def exhausted(self) -> bool: ...

    def start(self, committed: int) -> None: ...

    def read(self, size: int = CHUNK_BYTES) -> bytes: ...

    def seek(self, offset: int) -> None: ...

    def release(self, committed: int) -> None: ...


class Stop:
    """Set from a signal handler or another thread; waits poll it, so setting takes no lock."""

    def __init__(self) -> None:
        self._requested = False

    def set(self) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking within 50 ms of a stop; True if stopped."""
        deadline = time.monotonic() + seconds
        while not self._requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        return self._requested


@dataclass(frozen=True)
class StreamTarget:
    """Which stream of which job to write: the server names it `stream`, else node[/rank]."""

    server: str
    job: str
    node: str
    rank: int | None = None
    stream: str | None = None

    @property
    def logs_url(self) -> str:
        return f"{self.server.rstrip('/')}/v1/jobs/{quote(self.job, safe='')}/logs"

    @property
    def stream_id(self) -> str:
        if self.stream is not None:
            return self.stream
        return self.node if self.rank is None else f"{self.node}/{self.rank}"

    def params(self, offset: int | None = None) -> dict[str, str | int]:
        params: dict[str, str | int] = {"node": self.node}
        if self.rank is not None:
            params["rank"] = self.rank
        if self.stream is not None:
            params["stream"] = self.stream
        if offset is not None:
            params["offset"] = offset
        return params


@dataclass(frozen=True)
class UploadPolicy:
    chunk_bytes: int = CHUNK_BYTES
    max_request_bytes: int = 8 * 1024 * 1024
    max_request_seconds: float = 10.0
    """Well under the server's idle timeout (60 s by default), so it never cuts a quiet upload."""
    request_spread: float = 0.1
    """Each request after the first lasts a random time in the last this share of
    `max_request_seconds` (`Shipper._request_seconds`); 0 makes every request last the limit."""
    poll_seconds: float = 0.2
    start_timeout_s: float = 10.0
    """How long an unreachable server at start is retried before giving up (exit 2)."""
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.request_spread < 1.0:
            raise ValueError("request_spread must be in [0, 1)")


@dataclass
class _Request:
    start: int
    sent: int = 0
    reached_end: bool = False


@dataclass
class Shipper:
    """Ships one source to one stream until the source is exhausted or `stop` is set."""

    target: StreamTarget
    source: Source
    http: httpx.Client
    progress: Progress
    policy: UploadPolicy = field(default_factory=UploadPolicy)
    stop: Stop = field(default_factory=Stop)
    fallbacks: tuple[str, ...] = ()
    """Other base URLs of the same service (replicas on one database): a connection that
    fails moves the stream to the next, which resumes it from the committed offset."""
    rng: random.Random = field(default_factory=random.Random)
    """Draws each request's length (`_request_seconds`)."""

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.policy.backoff_base_s, self.policy.backoff_cap_s)
        self._servers = (self.target.server, *self.fallbacks)
        self._phased = False
        """Whether this run's requests have their random phase (`_request_seconds`)."""

    def _request_seconds(self) -> float:
        """How long the next request may stay open, at most `max_request_seconds`.

        Shippers that start together (a job's nodes at launch, a whole fleet after a server
        restart) would otherwise end and reopen their uploads in the same second, every
        `max_request_seconds`, and the server would take the whole fleet's final commits and
        opens at once, each upload waiting behind the others (docs/scale-out.md, "Uploads
        spread over time"). So the first request after a start or a resync lasts a random
        share of the limit, which spreads a fleet over the whole interval at once, and each
        later one a random time in its last `request_spread`, which keeps the fleet spread at
        almost the same number of requests.
        """
        limit = self.policy.max_request_seconds
        if not self._phased:
            self._phased = True
            return limit * self.rng.uniform(0.1, 1.0)
        return limit * self.rng.uniform(1.0 - self.policy.request_spread, 1.0)

    def _fail_over(self, exc: httpx.TransportError) -> None:
        """The next server in the list, when the transport failed (refused, reset, timed out);
        an answer from a server, even an error, keeps the stream where it is."""
        if len(self._servers) < 2:
            return
        at = self._servers.index(self.target.server)
        server = self._servers[(at + 1) % len(self._servers)]
        self.progress.warn(f"{_describe(exc)}: switching to {server}")
        self.target = replace(self.target, server=server)

    def run(self) -> None:
        """Raises ShipError for what retrying cannot fix; returns when done or stopped."""
        state = self._initial_state()
        committed = state.committed_offset
        self.source.start(committed)
        self.progress.stream(committed, state.lines)
        while not self.stop.is_set():
            first = self.source.read(self.policy.chunk_bytes)
            if first:
                if self._ship(first):
                    self._ship_last_line()
                    return
            elif self.source.exhausted:
                return
            else:
                self.stop.wait(self.policy.poll_seconds)

    def _ship(self, first: bytes) -> bool:
        """One request, and recovery if it fails. True when it carried the source to its end."""
        request = _Request(start=self.source.offset - len(first))
        self.progress.stats.requests += 1
        try:
            try:
                response = self.http.post(
                    self.target.logs_url,
                    params=self.target.params(request.start),
                    content=self._body(first, request),
                    headers=TEXT,
                )
            except httpx.TransportError as exc:
                self._fail_over(exc)
                raise _RetryableError(f"upload interrupted: {_describe(exc)}") from exc
            receipt = self._receipt(response)
        except _OffsetGapError as gap:
            self.progress.warn(f"server expects offset {gap.expected_offset}: resuming there")
            repeated = self._backoff.failures > 0
            delay = self._backoff.next_delay()
            if not (repeated and self.stop.wait(delay)):
                self.source.seek(gap.expected_offset)
            return False
        except _RetryableError as exc:
            self._retry_after(exc)
            return False
        self._backoff.reset()
        self.progress.accepted(receipt.lines_accepted, receipt.stream_lines)
        self.progress.committed(receipt.next_offset)
        if receipt.next_offset != self.source.offset:
            # The server kept back a partial line (it commits whole lines): resend it later.
            self.source.seek(receipt.next_offset)
        self.source.release(receipt.next_offset)
        return request.reached_end and not self.stop.is_set()

    def _ship_last_line(self) -> None:
        """At the very end, the server holds everything but a last line without its newline.

        Offset uploads commit whole lines only, so that line goes alone in an upload without
        offset, which the server takes as whole lines. Such an upload cannot be deduplicated,
        so after a failure it is resent only if the committed offset shows it did not land.
        """
        start, tail = self.source.offset, bytearray()
        while chunk := self.source.read(self.policy.chunk_bytes):
            tail += chunk
        if not tail:
            return
        if b"\n" in tail:
            self.progress.warn(f"server committed up to {start}, short of the end")
            return
        while not self.stop.is_set():
            self.progress.stats.requests += 1
            try:
                try:
                    response = self.http.post(
                        self.target.logs_url, params=self.target.params(), content=bytes(tail),
                        headers=TEXT,
                    )  # fmt: skip
                except httpx.TransportError as exc:
                    self._fail_over(exc)
                    raise _RetryableError(f"upload interrupted: {_describe(exc)}") from exc
                receipt = self._receipt(response)
            except (_RetryableError, _OffsetGapError) as exc:
                self._retry_after(exc)
                committed = self.source.offset
                if committed != start:
                    if committed < start + len(tail):
                        self.progress.warn(f"server offset moved to {committed}: not resending")
                    return
                continue
            self.progress.accepted(receipt.lines_accepted, receipt.stream_lines)
            self.progress.committed(receipt.next_offset)
            return

    def _retry_after(self, failure: Exception) -> None:
        """Wait (backoff or Retry-After), then resync with the server's committed offset."""
        self.progress.stats.retries += 1
        retry_after = failure.retry_after_s if isinstance(failure, _RetryableError) else None
        delay = self._backoff.next_delay(retry_after)
        self.progress.warn(f"{failure}; retrying in {delay:.1f}s")
        if not self.stop.wait(delay):
            self._resync()

    def _body(self, first: bytes, request: _Request) -> Iterator[bytes]:
        """The request body: chunks as the source has them, until a limit, the end or a stop."""
        deadline = time.monotonic() + self._request_seconds()
        chunk = first
        while chunk:
            request.sent += len(chunk)
            self.progress.sent(chunk)
            yield chunk
            chunk = self._next_chunk(request, deadline)

    def _next_chunk(self, request: _Request, deadline: float) -> bytes:
        """The request's next chunk, waiting for the source if need be; b"" ends the request."""
        room = min(self.policy.chunk_bytes, self.policy.max_request_bytes - request.sent)
        while room > 0 and not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return b""
            chunk = self.source.read(room)
            if chunk:
                return chunk
            if self.source.exhausted:
                request.reached_end = True
                return b""
            self.stop.wait(min(self.policy.poll_seconds, left))
        return b""

    def _receipt(self, response: httpx.Response) -> UploadReceipt:
        if response.status_code == 200:
            return _parse(UploadReceipt, response)
        if response.status_code == 409:
            reply = _error(response)
            if reply.expected_offset is not None:
                raise _OffsetGapError(reply.expected_offset)
        if response.status_code == 404:
            raise ShipError(
                f"no log endpoint at {self.target.logs_url} (404): is --server the diagnoser"
                " base URL?",
                ExitCode.USAGE,
            )
        _raise_for(response)

    def _initial_state(self) -> StreamState:
        """The stream at start; an unreachable server is retried for a short while."""
        deadline = time.monotonic() + self.policy.start_timeout_s
        while True:
            try:
                return self._stream_state()
            except _RetryableError as exc:
                left = deadline - time.monotonic()
                unreachable = isinstance(exc.__cause__, httpx.TransportError)
                if unreachable and left <= 0:
                    raise ShipError(
                        f"cannot reach {self.target.server}: {exc}", ExitCode.USAGE
                    ) from exc
                delay = self._backoff.next_delay(exc.retry_after_s)
                if unreachable:
                    delay = min(delay, max(left, 0.0))
                if self.stop.wait(delay):
                    message = "stopped before the server was reached"
                    raise ShipError(message, ExitCode.USAGE) from exc

    def _resync(self) -> None:
        """Ask the committed offset again (retrying until it answers) and seek the source there.

        The next request takes a new random phase: a failure that hit many shippers at once
        (the server restarting) has put them back in step."""
        self._phased = False
        while not self.stop.is_set():
            try:
                state = self._stream_state()
            except _RetryableError as exc:
                self.progress.stats.retries += 1
                delay = self._backoff.next_delay(exc.retry_after_s)
                self.progress.warn(f"{exc}; retrying in {delay:.1f}s")
                self.stop.wait(delay)
                continue
            committed = state.committed_offset
            self.progress.stream(committed, state.lines)
            self.source.seek(committed)
            self.source.release(committed)
            return

    def _stream_state(self) -> StreamState:
        """The server's committed offset and line count (a stream not created yet: zeros)."""
        try:
            response = self.http.get(self.target.logs_url, params=self.target.params())
        except httpx.TransportError as exc:
            self._fail_over(exc)
            raise _RetryableError(_describe(exc)) from exc
        if response.status_code == 404:
            return StreamState(committed_offset=0, lines=0)
        if response.status_code == 200:
            return _parse(StreamState, response)
        _raise_for(response)


def _raise_for(response: httpx.Response) -> NoReturn:
    """Turn a non-2xx answer into the retry, or the final error, it calls for."""
    status = response.status_code
    reply = _error(response)
    what = f"{status} {reply.error or response.reason_phrase}".strip()
    if reply.detail:
        what += f": {reply.detail}"
    if status in (401, 403):
        raise ShipError(f"authentication failed ({what}): check --token", ExitCode.AUTH)
    if status in (408, 429) or status >= 500:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        raise _RetryableError(f"server answered {what}", retry_after)
    if status in (400, 422):
        raise ShipError(f"server refused the request ({what})", ExitCode.USAGE)
    raise ShipError(f"server rejected the upload ({what})", ExitCode.REJECTED)


def _error(response: httpx.Response) -> ErrorReply:
    try:
        return ErrorReply.model_validate_json(response.content)
    except ValidationError:
        return ErrorReply()


Reply = TypeVar("Reply", bound=BaseModel)


def _parse(model: type[Reply], response: httpx.Response) -> Reply:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ShipError(
            f"{response.request.url} did not answer like a diagnoser server "
            f"({response.status_code}, {response.headers.get('content-type', 'no content type')})",
            ExitCode.USAGE,
        ) from exc


def _describe(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0].rstrip(".")
