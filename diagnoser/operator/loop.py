"""The claim loop: claim -> execute -> complete, with leases kept alive and retries with backoff.

- Each claimed action runs in its own worker thread while a task extends its lease every third
  of the lease time, so a long verification does not lose its lease.
- Transient Kubernetes errors (no answer, 409 races, 429, 5xx) are retried with exponential
  backoff; after the last attempt, or on any other error, the action is completed `failed` with
  the reason. The service decides what happens next (retry later, escalate).
- Redelivery is safe twice over: every change is idempotent on the cluster (see cordon, restart,
  verify), and `done` outcomes are remembered by idempotency key, so an action delivered again
  after its completion was lost in transit is reported again without touching the cluster. A
  failed one is tried again: the service re-released it on purpose.
- SIGTERM (the `stop` event) ends claiming at once, lets cordons and restarts in progress finish
  and report, and aborts verification waits without reporting: their leases expire and the next
  delivery resumes with the test Jobs already created.
- Dry run: actions are claimed, the cluster is read, nothing is written, and each action is
  completed `done` with `result.dry_run = true` and what would have been done (docs/operator.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from diagnoser.operator.client import (
    ActionApiError,
    ActionClient,
    ActionNotFoundError,
    LeaseLostError,
)
from diagnoser.operator.cluster import describe, is_retryable
from diagnoser.operator.executor import OPERATOR_KINDS, Executor
from diagnoser.operator.outcome import Outcome
from diagnoser.operator.verify import VerificationAbortedError
from diagnoser.operator.wire import (
    ActionKind,
    ActionView,
    ClaimRequest,
    CompleteRequest,
    CompletionStatus,
    ExtendRequest,
)

log = logging.getLogger("diagnoser.operator")


@dataclass(frozen=True)
class LoopSettings:
    operator_id: str
    kinds: tuple[ActionKind, ...] = OPERATOR_KINDS
    max_actions: int = 4
    lease_seconds: int = 120
    wait_seconds: int = 10
    attempts: int = 4
    """Tries of one action against Kubernetes before it is completed `failed`."""
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 30.0
    remembered: int = 4096
    """Outcomes kept by idempotency key for redeliveries."""
    extend_every_seconds: float | None = None
    """Lease extension period; None: a third of the lease."""


class Operator:
    def __init__(self, client: ActionClient, executor: Executor, settings: LoopSettings) -> None:
        self.client = client
        self.executor = executor
        self.settings = settings
        self.outcomes: OrderedDict[str, Outcome] = OrderedDict()
        """`done` outcomes by idempotency key; a failed action is tried again if redelivered."""
        self._thread_stop = threading.Event()

    def backoff(self, attempt: int) -> float:
        delay = self.settings.backoff_seconds * 2 ** (attempt - 1)
        return float(min(delay, self.settings.backoff_max_seconds))

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and handle actions until `stop` is set."""
        failures = 0
        stopper = asyncio.create_task(self._bridge(stop))
        try:
            while not stop.is_set():
                try:
                    actions = await self._claim(stop)
                except ActionApiError as exc:
                    failures += 1
                    delay = self.backoff(failures)
                    log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                    await _wait(stop, delay)
                    continue
                failures = 0
                if actions:
                    await asyncio.gather(*(self.handle(action) for action in actions))
        finally:
            stopper.cancel()

    async def _bridge(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._thread_stop.set()

    async def _claim(self, stop: asyncio.Event) -> list[ActionView]:
        request = ClaimRequest(
            operator_id=self.settings.operator_id,
            kinds=list(self.settings.kinds),
            max=self.settings.max_actions,
            lease_seconds=self.settings.lease_seconds,
            wait_seconds=self.settings.wait_seconds,
        )
        claim = asyncio.create_task(self.client.claim(request))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({claim, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not claim.done():
            claim.cancel()  # anything claimed in flight is redelivered after its lease
            with contextlib.suppress(asyncio.CancelledError, ActionApiError):
                await claim
            return []
        return claim.result()

    async def handle(self, action: ActionView) -> None:
        key = action.idempotency_key
        outcome = self.outcomes.get(key)
        if outcome is not None:
            log.info("action %s redelivered; reporting its earlier outcome again", action.id)
        else:
            keeper = asyncio.create_task(self._keep_lease(action))
            try:
                outcome = await self._execute(action)
            finally:
                keeper.cancel()
            if outcome is None:
                log.info("action %s left to its lease: the operator is stopping", action.id)
                return
            if outcome.status is CompletionStatus.DONE:
                self.outcomes[key] = outcome
                while len(self.outcomes) > self.settings.remembered:
                    self.outcomes.popitem(last=False)
        await self._complete(action, outcome)

    async def _execute(self, action: ActionView) -> Outcome | None:
        attempts = self.settings.attempts
        for attempt in range(1, attempts + 1):
            try:
                return await asyncio.to_thread(self.executor.execute, action, self._thread_stop)
            except VerificationAbortedError:
                return None
            except TimeoutError as exc:
                return Outcome.failed(str(exc))
            except ApiException as exc:
                reason = describe(exc)
                if not is_retryable(exc):
                    return Outcome.failed(reason)
            except urllib3.exceptions.HTTPError as exc:
                reason = f"Kubernetes API unreachable: {type(exc).__name__}"
            except Exception as exc:  # a surprise in an object's shape must not stop the loop
                log.exception("action %s: unexpected error", action.id)
                return Outcome.failed(f"operator error: {type(exc).__name__}: {exc}")
            if attempt == attempts:
                return Outcome.failed(f"{reason} (gave up after {attempts} attempts)")
            delay = self.backoff(attempt)
            log.warning("action %s: %s; retry %d in %.1fs", action.id, reason, attempt, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _keep_lease(self, action: ActionView) -> None:
        period = self.settings.extend_every_seconds or max(1.0, self.settings.lease_seconds / 3)
        request = ExtendRequest(
            operator_id=self.settings.operator_id, lease_seconds=self.settings.lease_seconds
        )
        while True:
            await asyncio.sleep(period)
            try:
                await self.client.extend(action.id, request)
            except LeaseLostError:
                log.warning("action %s: lease lost to another operator", action.id)
                return
            except ActionApiError as exc:
                log.warning("action %s: lease extension failed (%s)", action.id, exc)

    async def _complete(self, action: ActionView, outcome: Outcome) -> None:
        request = CompleteRequest(
            operator_id=self.settings.operator_id,
            status=outcome.status,
            message=outcome.message,
            result=outcome.result or None,
        )
        for attempt in range(1, self.settings.attempts + 1):
            try:
                await self.client.complete(action.id, request)
            except (LeaseLostError, ActionNotFoundError) as exc:
                log.warning("action %s: completion refused (%s)", action.id, exc)
                return
            except ActionApiError as exc:
                if not exc.retryable or attempt == self.settings.attempts:
                    log.error("action %s: completion failed (%s)", action.id, exc)
                    return
                await asyncio.sleep(self.backoff(attempt))
                continue
            log.info("action %s %s: %s", action.id, outcome.status, outcome.message)
            return


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
