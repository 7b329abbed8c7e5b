"""Delivers `notify` actions to webhooks: generic JSON, Slack, PagerDuty Events v2.

`deliver()` routes one action to every destination whose `match` selects it (or the default
one), POSTs each payload with httpx, and retries what may succeed later: connection errors,
timeouts, 5xx and 429 (after the server's `Retry-After` when it sends one), with exponential
backoff and full jitter. Any other status is final. Every request carries the action's
idempotency key (`Idempotency-Key` header; PagerDuty's `dedup_key`), so a redelivery, after a
crash or a lost answer, is one alert for receivers that honour it. A total deadline bounds the
whole delivery, retries included, so it ends well inside the worker's lease.

`NotifyWorker` is the consumer loop: it claims `notify` actions from an `ActionQueue` (the
store, or the operator API over HTTP), delivers them and completes them `done` or `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from diagnoser import __version__
from diagnoser.actions import payloads
from diagnoser.actions.notify_wire import NOTIFY_KIND, ActionView, NotifyTarget
from diagnoser.config import NotifyDestination, NotifySettings
from diagnoser.llm.redaction import Redactor
from diagnoser.templates.family import family_of

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300
"""Of a receiver's error body, kept in the result (redacted) to say why it refused."""

MAX_MESSAGE_CHARS = 1000
"""Of the completion message (the result holds the details)."""

Outcome = Literal["delivered", "rejected", "gave_up"]


@dataclass(frozen=True, slots=True)
class DestinationResult:
    name: str
    kind: str
    outcome: Outcome
    """`delivered` (2xx), `rejected` (a final status: 4xx other than 429, 3xx), or `gave_up`
    (retryable failures until `max_attempts` or the deadline)."""
    attempts: int
    status: int | None
    """The last HTTP status; None when no answer came (connection error, timeout)."""
    error: str | None = None

    @property
    def delivered(self) -> bool:
        return self.outcome == "delivered"

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "status": self.status,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    action_id: int
    idempotency_key: str
    destinations: tuple[DestinationResult, ...]
    redactions: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every routed destination took it (vacuously true when none was routed)."""
        return all(d.delivered for d in self.destinations)

    @property
    def message(self) -> str:
        if not self.destinations:
            return "no notify destination matches this action"
        parts = [
            f"{d.name}: {d.outcome}" + (f" ({d.error})" if d.error else "")
            for d in self.destinations
        ]
        return payloads.clip("; ".join(parts), MAX_MESSAGE_CHARS)

    def as_json(self) -> dict[str, Any]:
        """The `result` the action is completed with."""
        return {
            "idempotency_key": self.idempotency_key,
            "destinations": [d.as_json() for d in self.destinations],
            "redactions": self.redactions,
        }


async def _prefix(response: httpx.Response) -> str:
    """The start of an error body: enough to say why, never a large read."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= MAX_ERROR_CHARS:
            break
    return data[:MAX_ERROR_CHARS].decode("utf-8", errors="replace")


def route(settings: NotifySettings, target: NotifyTarget, family: str) -> list[NotifyDestination]:
    """Every destination whose match selects the action; else the default, if one is set.

    The default destination takes only what no other destination selects (its own `match`
    is not consulted), so a catch-all channel does not receive every action twice over.
    """
    chosen = [
        d
        for d in settings.destinations
        if d.name != settings.default and matches(d, target, family)
    ]
    if not chosen and settings.default is not None:
        chosen = [d for d in settings.destinations if d.name == settings.default]
    return chosen


def matches(destination: NotifyDestination, target: NotifyTarget, family: str) -> bool:
    m = destination.match
    return (
        (not m.families or family in m.families)
        and (not m.namespaces or target.namespace in m.namespaces)
        and (not m.audiences or target.audience in m.audiences)
    )


def body_for(destination: NotifyDestination, notice: payloads.Notice) -> dict[str, Any]:
    if destination.kind == "slack":
        return payloads.slack_payload(notice)
    if destination.kind == "pagerduty":
        assert destination.routing_key is not None  # the settings validator requires it
        return payloads.pagerduty_payload(notice, destination.routing_key.get_secret_value())
    return payloads.generic_payload(notice)


def retry_after(response: httpx.Response, now: datetime | None = None) -> float | None:
    """Seconds the server asked us to wait (delta-seconds or an HTTP date), if it said."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def header_value(key: str) -> str:
    """The key as sent in a header: itself when printable ASCII, else percent-encoded."""
    return key if key.isascii() and key.isprintable() else quote(key, safe="")


def backoff(attempt: int, settings: NotifySettings, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**(attempt-1))]."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (attempt - 1))
    return rng.uniform(0, ceiling)


class _Poster:
    """The retry loop of one destination, against one shared deadline."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        settings: NotifySettings,
        redactor: Redactor,
        deadline: float,
        rng: random.Random,
    ) -> None:
        self._client = client
        self._settings = settings
        self._redactor = redactor
        self._deadline = deadline
        self._rng = rng

    def _left(self) -> float:
        return self._deadline - asyncio.get_running_loop().time()

    def _scrub(self, text: str, url: str) -> str:
        """Error text without the destination URL (a Slack URL is a credential) or secrets."""
        return payloads.clip(
            self._redactor.redact(text.replace(url, "<url>")).text, MAX_ERROR_CHARS
        )

    async def post(
        self, destination: NotifyDestination, body: dict[str, Any], headers: Mapping[str, str]
    ) -> DestinationResult:
        assert destination.url is not None  # the settings validator fills or requires it
        url = destination.url.get_secret_value()
        status: int | None = None
        error: str | None = None
        attempt = 0
        while (left := self._left()) > 0:
            attempt += 1
            wait: float | None = None
            timeout = min(left, self._settings.request_timeout_s)
            try:
                async with (
                    asyncio.timeout(timeout),
                    self._client.stream(
                        "POST",
                        url,
                        json=body,
                        headers=headers,
                        timeout=timeout,
                        follow_redirects=False,
                    ) as response,
                ):
                    status = response.status_code
                    text = "" if response.is_success else await _prefix(response)
            except (httpx.RequestError, TimeoutError) as exc:
                status = None
                error = self._scrub(f"{type(exc).__name__}: {exc}".rstrip(": "), url)
            else:
                if response.is_success:
                    return DestinationResult(
                        destination.name, destination.kind, "delivered", attempt, status
                    )
                error = self._scrub(f"HTTP {status}: {text}".strip(), url)
                if status != 429 and status < 500:
                    return DestinationResult(
                        destination.name, destination.kind, "rejected", attempt, status, error
                    )
                wait = retry_after(response)
            if attempt >= self._settings.max_attempts:
                break
            delay = wait if wait is not None else backoff(attempt, self._settings, self._rng)
            if delay >= self._left():
                error = f"{error}; next try ({delay:.1f}s away) is past the deadline"
                break
            await asyncio.sleep(delay)
        else:
            error = f"{error}; deadline passed" if error else "deadline passed"
        return DestinationResult(
            destination.name, destination.kind, "gave_up", attempt, status, error
        )


async def deliver(
    action: ActionView,
    settings: NotifySettings,
    *,
    client: httpx.AsyncClient | None = None,
    redactor: Redactor | None = None,
    rng: random.Random | None = None,
) -> DeliveryResult:
    """Send one `notify` action to every destination routed to it, concurrently.

    Raises `ValueError` when the action is not a `notify` action with a valid target. Pass a
    shared `client` (and `redactor`) from a long-lived caller; without them each call builds its
    own.
    """
    if action.kind != NOTIFY_KIND:
        raise ValueError(f"action {action.id} is {action.kind!r}, not {NOTIFY_KIND!r}")
    raw: object = action.target
    if isinstance(raw, BaseModel):  # the typed target of a richer wire model
        raw = raw.model_dump(mode="json")
    try:
        target = NotifyTarget.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"action {action.id} has no valid notify target: {exc}") from exc
    redactor = redactor or Redactor(settings.redact_patterns)
    notice = payloads.notice(action, target, redactor, settings.public_url)
    destinations = route(settings, target, target.family or family_of(action.job_id))
    if not destinations:
        return DeliveryResult(action.id, action.idempotency_key, (), notice.redactions)
    headers = {
        "Idempotency-Key": header_value(action.idempotency_key),
        "User-Agent": f"diagnoser/{__version__}",
    }
    deadline = asyncio.get_running_loop().time() + settings.deadline_s
    own_client = client is None
    http = client or httpx.AsyncClient(follow_redirects=False)
    try:
        poster = _Poster(http, settings, redactor, deadline, rng or random.Random())
        results = await asyncio.gather(
            *(poster.post(d, body_for(d, notice), headers) for d in destinations)
        )
    finally:
        if own_client:
            await http.aclose()
    return DeliveryResult(action.id, action.idempotency_key, tuple(results), notice.redactions)


class ActionQueue(Protocol):
    """Where `notify` actions come from: the outbox directly, or the operator API over HTTP.

    `claim` leases up to `max` claimable actions of the given kinds for `lease_seconds`;
    `complete` records the outcome (`status` is `done` or `failed`) and is idempotent.
    """

    async def claim(
        self, kinds: Sequence[str], max: int, lease_seconds: int
    ) -> list[ActionView]: ...

    async def complete(
        self, id: int, status: str, message: str, result: dict[str, Any] | None
    ) -> object: ...


class NotifyWorker:
    """Claims `notify` actions, delivers them, completes them; runs until stopped.

    A crash between delivery and completion leaves the action claimed; once its lease runs out
    it is claimed again and delivered again under the same idempotency key.
    """

    def __init__(
        self,
        queue: ActionQueue,
        settings: NotifySettings,
        *,
        client: httpx.AsyncClient | None = None,
        batch: int = 10,
        idle_s: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._client = client
        self._batch = batch
        self._idle_s = idle_s
        self._rng = rng or random.Random()
        self._redactor = Redactor(settings.redact_patterns)

    async def run_once(self) -> int:
        """One claim and the delivery of what it returned; the number of actions handled."""
        actions = await self._queue.claim([NOTIFY_KIND], self._batch, self._settings.lease_seconds)
        if not actions:
            return 0
        own_client = self._client is None
        http = self._client or httpx.AsyncClient(follow_redirects=False)
        try:
            outcomes = await asyncio.gather(
                *(self._handle(http, a) for a in actions), return_exceptions=True
            )
        finally:
            if own_client:
                await http.aclose()
        for action, outcome in zip(actions, outcomes, strict=True):
            if isinstance(outcome, Exception):
                # Left claimed: its lease runs out and it is delivered again, same key.
                log.error("notify action %d: %s: %s", action.id, type(outcome).__name__, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return len(actions)

    async def _handle(self, http: httpx.AsyncClient, action: ActionView) -> None:
        try:
            result = await deliver(
                action, self._settings, client=http, redactor=self._redactor, rng=self._rng
            )
        except ValueError as exc:
            await self._queue.complete(action.id, "failed", str(exc)[:MAX_ERROR_CHARS], None)
            return
        if result.destinations == ():
            log.warning("notify action %d: no destination matches it", action.id)
        status = "done" if result.ok else "failed"
        await self._queue.complete(action.id, status, result.message, result.as_json())

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until `stop` is set; a failing queue is retried after `idle_s`, not fatal."""
        if self._client is None:
            async with httpx.AsyncClient(follow_redirects=False) as client:
                self._client = client
                try:
                    await self._loop(stop)
                finally:
                    self._client = None
        else:
            await self._loop(stop)

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                handled = await self.run_once()
            except Exception:
                log.exception("notify worker: claim or completion failed; retrying")
                handled = 0
            if handled == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._idle_s)
