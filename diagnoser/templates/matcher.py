"""The whole filter set as one compiled multi-pattern matcher over a batch.

`HyperscanMatcher` (one database, one scan of the batch) where the wheel exists, `RegexMatcher`
(one `regex` alternation) otherwise; both report the same lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from operator import add
from re import _constants as sre  # type: ignore[attr-defined,unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined,unused-ignore]
from typing import Protocol

import regex

from diagnoser.rules import hyperscan_db
from diagnoser.templates.validation import DEFAULT_TIMEOUT, compile_filter


class Matcher(Protocol):
    name: str

    def match(self, lines: Sequence[str]) -> list[int | None]:
        """Per line, the index (into the compiled patterns) of a matching pattern, or None."""


class HyperscanMatcher:
    """Every pattern in one hyperscan database, one scan per batch; `regex` checks the rest.

    A fullmatch ends exactly at its line's end, so each hit's end offset names its line: the
    line ends are computed in bulk (C-speed `accumulate`), and a dict lookup per line does the
    rest. No per-hit Python work beyond the callback.

    Hyperscan (0.9.1 wheel) misses real matches in some multi-pattern multi-line databases:
    `^[ \\t]+global[ \\t]+batch$` stops matching a line that starts 22 bytes or more into the
    chunk once `^[ \\t]*-{22}` shares the database, though that one matches nothing (see
    tests/templates/test_filters.py). No flag we use causes it, and it cannot be predicted per
    pattern, so the lines hyperscan leaves are fullmatched again (`LiteralChecker`: the
    `regex` alternation's answers, each filter tried only on lines holding its literal text):
    a hit is never false (its end offset is its line's end), a miss is checked. Those lines
    are the few a filter set does not drop (novel, kept lines), and the skeleton memo of
    `FilterSet` answers most of them before they get here.
    """

    name = "hyperscan"

    def __init__(self, patterns: Sequence[str]) -> None:
        self._scanner = hyperscan_db.PatternScanner(
            [(p.encode("utf-8"), False) for p in patterns], allow_empty=True
        )
        self._check = LiteralChecker(patterns)

    def match(self, lines: Sequence[str]) -> list[int | None]:
        if not lines:
            return []
        text = "\n".join(lines)
        data = text.encode("utf-8", "replace")
        hits = self._scanner.scan(data)
        if not hits:
            return self._check.match(lines)
        if len(data) == len(text):
            lengths: Iterable[int] = map(len, lines)
        else:
            lengths = map(len, data.split(b"\n"))
        ends = map(add, accumulate(lengths), range(len(lines)))
        found: list[int | None] = list(map(dict(hits).get, ends))
        missed = [i for i, x in enumerate(found) if x is None]
        if missed:
            for i, y in zip(missed, self._check.match([lines[i] for i in missed]), strict=True):
                found[i] = y
        return found


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


class LiteralChecker:
    """`RegexMatcher`'s answers, trying on each line only the patterns that can match it.

    Every match of a filter contains its longest run of required literal text (`iteration`,
    `[Gloo]`, `....`): a line without that text never meets the pattern, an `in` test where
    the alternation would run every pattern. Patterns with no required text are tried on every
    line. Candidates go in pattern order, so the answer is the alternation's: the first
    pattern that fullmatches.
    """

    name = "regex-literal"

    def __init__(self, patterns: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._timeout = timeout
        self._patterns = list(patterns)
        self._tests = [(i, required_text(p)) for i, p in enumerate(patterns)]
        self._fullmatch: dict[int, Callable[..., regex.Match[str] | None]] = {}

    def _compiled(self, i: int) -> Callable[..., regex.Match[str] | None]:
        """Compiled on first need: most filters are never tried here (hyperscan answered)."""
        fullmatch = self._fullmatch.get(i)
        if fullmatch is None:
            fullmatch = self._fullmatch[i] = compile_filter(self._patterns[i]).fullmatch
        return fullmatch

    def match(self, lines: Sequence[str]) -> list[int | None]:
        out: list[int | None] = []
        append = out.append
        tests = self._tests
        timeout = self._timeout
        for line in lines:
            found = None
            for i, text in tests:
                if text not in line:
                    continue
                try:
                    hit = self._compiled(i)(line, timeout=timeout)
                except TimeoutError:
                    hit = None  # kept, never wrongly dropped
                if hit is not None:
                    found = i
                    break
            append(found)
        return out


def required_text(pattern: str) -> str:
    """The longest literal text every match of `pattern` contains ("" when none is known)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return ""
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return ""
    best = ""
    run: list[str] = []
    for op, av in [*parsed, (None, None)]:
        if op is sre.LITERAL:
            run.append(chr(av))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best


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
