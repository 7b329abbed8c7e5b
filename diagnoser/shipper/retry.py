"""When to try again: exponential backoff with jitter, and the server's Retry-After."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_AFTER_CAP_S = 300.0
"""A Retry-After beyond this is taken as this: a shipper that sleeps for hours looks dead."""


@dataclass
class Backoff:
    """Delays for consecutive failures: base * 2**n, capped, scaled by a random 50-100%.

    The jitter keeps a fleet of shippers, cut off by the same server restart, from coming
    back in lockstep. A Retry-After from the server replaces the computed delay (plus up to
    10% jitter for the same reason). `reset` after a success.
    """

    base_s: float = 0.5
    cap_s: float = 30.0
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self, retry_after_s: float | None = None) -> float:
        self.failures += 1
        if retry_after_s is not None:
            return retry_after_s * self.rng.uniform(1.0, 1.1)
        ceiling = min(self.cap_s, self.base_s * 2.0 ** (self.failures - 1))
        return ceiling * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)
