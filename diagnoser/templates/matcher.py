"""The whole filter set as one compiled multi-pattern matcher over a batch.

`HyperscanMatcher` (one database, one scan of the batch) where the wheel exists, `RegexMatcher`
(one `regex` alternation) otherwise; both report the same lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate
from operator import add
from typing import Protocol

import regex

from diagnoser.rules import hyperscan_db
from diagnoser.templates.validation import DEFAULT_TIMEOUT


class Matcher(Protocol):
    name: str

    def match(self, lines: Sequence[str]) -> list[int | None]:
        """Per line, the index (into the compiled patterns) of a matching pattern, or None."""


class HyperscanMatcher:
    """Every pattern in one hyperscan database, one scan per batch.

    A fullmatch ends exactly at its line's end, so each hit's end offset names its line: the
    line ends are computed in bulk (C-speed `accumulate`), and a dict lookup per line does the
    rest. No per-hit Python work beyond the callback.
    """

    name = "hyperscan"

    def __init__(self, patterns: Sequence[str]) -> None:
        self._scanner = hyperscan_db.PatternScanner([(p.encode("utf-8"), False) for p in patterns])

    def match(self, lines: Sequence[str]) -> list[int | None]:
        if not lines:
            return []
        text = "\n".join(lines)
        data = text.encode("utf-8", "replace")
        hits = self._scanner.scan(data)
        if not hits:
            return [None] * len(lines)
        if len(data) == len(text):
            lengths: Iterable[int] = map(len, lines)
        else:
            lengths = map(len, data.split(b"\n"))
        ends = map(add, accumulate(lengths), range(len(lines)))
        return list(map(dict(hits).get, ends))


class RegexMatcher:
    """The pure-`regex` path: one alternation, each pattern one capturing group."""

    name = "regex"

    def __init__(self, patterns: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        body = "|".join(f"({_without_anchors(p)})" for p in patterns)
        self._fullmatch = regex.compile(f"^(?:{body})$" if patterns else "(?!)").fullmatch
        self._timeout = timeout

    def match(self, lines: Sequence[str]) -> list[int | None]:
        fullmatch = self._fullmatch
        timeout = self._timeout
        out: list[int | None] = []
        append = out.append
        for line in lines:
            try:
                m = fullmatch(line, timeout=timeout)
            except TimeoutError:
                m = None
            append(None if m is None else (m.lastindex or 1) - 1)
        return out


def _without_anchors(pattern: str) -> str:
    """Drop the outer `^`/`$` (validated filters have no capturing group of their own)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    return body[:-1] if body.endswith("$") and not body.endswith("\\$") else body


def build_matcher(patterns: Sequence[str], *, engine: str = "auto") -> Matcher:
    """`engine`: "hyperscan", "regex", or "auto" (hyperscan when its wheel is installed)."""
    if engine == "hyperscan" or (engine == "auto" and hyperscan_db.available()):
        return HyperscanMatcher(patterns) if patterns else RegexMatcher(())
    if engine in ("regex", "auto"):
        return RegexMatcher(patterns)
    raise ValueError(f"unknown filter engine {engine!r}")
