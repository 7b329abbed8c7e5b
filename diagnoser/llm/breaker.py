"""A circuit breaker for the LLM endpoint: after repeated failures, stop calling for a while.

A dead or overloaded endpoint must not hold escalations for a full timeout each; while the
breaker is open every escalation ends `inconclusive` at once, and after `reset_after_s` one trial
call is let through (half-open): success closes it, failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        reset_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failure_threshold
        self._reset_after_s = reset_after_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_out = False
        self.trips = 0
        """Times it opened, for /metrics: a gauge sampled every scrape can miss a short trip."""

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at >= self._reset_after_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        """Whether a call may go out now; in half-open state only one trial at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._trial_out:
            self._trial_out = True
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_out = False

    def record_failure(self) -> None:
        self._trial_out = False
        if self._opened_at is not None:
            if self.state is BreakerState.HALF_OPEN:
                self.trips += 1  # the trial failed: open again
            self._opened_at = self._clock()
            return
        self._failures += 1
        if self._failures >= self._threshold:
            self._opened_at = self._clock()
            self.trips += 1
