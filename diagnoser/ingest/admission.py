"""Admission control: a bound on ingest requests in flight, answered with 429 beyond it."""

from __future__ import annotations


class Admission:
    """Refuse rather than queue: a client told to retry costs less than unbounded memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
