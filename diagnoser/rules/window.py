"""Job-wide counting for windowed rules ("N matches within W seconds on the same GPU")."""

from __future__ import annotations

from collections import deque
from typing import TypeVar

from diagnoser.rules.schema import Window

V = TypeVar("V")

MAX_KEYS = 10_000
"""Distinct (rule, entity) keys tracked per job; the oldest key is dropped beyond it."""


class WindowState:
    """Counts matches per (rule, key); bounded by `MAX_KEYS` keys of at most `count` entries."""

    __slots__ = ("_counts", "_distinct")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, tuple[str, ...]], deque[float]] = {}
        self._distinct: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}

    def hit(self, rule_id: str, window: Window, key: tuple[str, ...], value: str, t: float) -> int:
        """Record a match at time `t`; return the count that satisfied the window, else 0.

        A satisfied window resets, so the rule fires again only after `count` new matches.
        """
        slot = (rule_id, key)
        horizon = t - window.seconds
        if window.distinct is None:
            times = self._counts.get(slot)
            if times is None:
                times = self._counts[slot] = deque(maxlen=window.count)
                _bound(self._counts)
            times.append(t)
            while times and times[0] < horizon:
                times.popleft()
            if len(times) >= window.count:
                del self._counts[slot]
                return window.count
            return 0
        seen = self._distinct.get(slot)
        if seen is None:
            seen = self._distinct[slot] = {}
            _bound(self._distinct)
        seen.pop(value, None)
        seen[value] = t
        for old in [v for v, when in seen.items() if when < horizon]:
            del seen[old]
        while len(seen) > window.count:
            del seen[next(iter(seen))]
        if len(seen) >= window.count:
            del self._distinct[slot]
            return window.count
        return 0


def _bound(table: dict[tuple[str, tuple[str, ...]], V]) -> None:
    while len(table) > MAX_KEYS:
        del table[next(iter(table))]
