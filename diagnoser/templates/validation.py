"""Validation of a candidate filter before use: each check's failure is the recorded reason.

In order: compiles with `regex` and uses only what both engines run identically (no lookaround,
no back-reference, no capturing group, nothing that can match a newline); not over-broad (at
least `MIN_LITERAL` non-blank literal characters in every match, no match on a few generic
lines); fullmatches every sample of its template; matches no line of the guard corpus (the rule
pack's `examples.match` lines and the failure lines seen so far); finishes within `timeout`
seconds on each adversarial input (`regex` timeout). `digit_blind` says whether the skeleton
memo of `FilterSet` may serve a filter.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from functools import lru_cache
from re import _constants as sre  # type: ignore[attr-defined,unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined,unused-ignore]
from typing import Any

import regex

MIN_LITERAL = 4
"""Non-blank literal characters every match must contain; fewer is a `.*`-like filter."""
PROBES = ("", " ", "x", "0", "-", "ok", "a b", "hello world", "1 2 3", "foo=1 bar=2", "[x]")
"""Generic lines no real filter matches: a filter that does is over-broad."""
DEFAULT_TIMEOUT = 0.05
"""Seconds a candidate may spend on one adversarial input before it is rejected."""
MAX_CORPUS = 4096
"""Guard corpus lines remembered beyond the rule examples (failure-word lines seen so far)."""


@lru_cache(maxsize=1024)
def compile_filter(pattern: str) -> regex.Pattern[str]:
    """`regex.compile`, remembered: a filter set is rebuilt each time filters are learned, and
    the `regex` parser takes milliseconds per filter (filters run to hundreds of characters)."""
    return regex.compile(pattern)


class _UnsupportedError(ValueError):
    pass


def _check_structure(items: Any) -> int:
    """Raise on constructs one engine would treat differently; return required literal count."""
    required = 0
    for op, av in items:
        if op is sre.LITERAL:
            if av == 10:
                raise _UnsupportedError("matches a newline")
            if chr(av) not in " \t":
                required += 1
        elif op in (sre.ASSERT, sre.ASSERT_NOT, sre.GROUPREF, sre.GROUPREF_EXISTS):
            raise _UnsupportedError("lookaround or back-reference")
        elif op is sre.ANY:
            raise _UnsupportedError("`.` (write the slot's class)")
        elif op in (sre.IN, sre.NOT_LITERAL, sre.CATEGORY):
            if _class_takes_newline(op, av):
                raise _UnsupportedError("a class that matches a newline")
        elif op is sre.SUBPATTERN:
            if av[0] is not None:
                raise _UnsupportedError(
                    "a capturing group (write `(?:...)`, name slots in `names`)"
                )
            required += _check_structure(av[3])
        elif op is sre.ATOMIC_GROUP:
            required += _check_structure(av)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            inner = _check_structure(av[2])
            required += inner * min(av[0], MIN_LITERAL)
        elif op is sre.BRANCH:
            counts = [_check_structure(alt) for alt in av[1]]
            required += min(counts, default=0)
        elif op is sre.AT:
            continue
        else:
            raise _UnsupportedError(f"unsupported construct {op}")
    return required


_BLANKS = frozenset((32, 9))


def _exact(items: Any) -> bool:
    """Whether the pattern has no variable part: literals and blank runs only (a lone `}` line
    padded any way). Such a filter takes one text, so few literals do not make it broad."""
    for op, av in items:
        if op is sre.LITERAL or op is sre.AT:
            continue
        if op is sre.IN:
            if not all(iop is sre.LITERAL and iav in _BLANKS for iop, iav in av):
                return False
        elif op is sre.SUBPATTERN:
            if not _exact(av[3]):
                return False
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            if not _exact(av[2]):
                return False
        else:
            return False
    return True


def _class_takes_newline(op: Any, av: Any) -> bool:
    if op is sre.NOT_LITERAL:
        return bool(av != 10)
    items = [(op, av)] if op is sre.CATEGORY else list(av)
    negate = bool(items and items[0][0] is sre.NEGATE)
    hit = False
    for iop, iav in items:
        if (iop is sre.LITERAL and iav == 10) or (iop is sre.RANGE and iav[0] <= 10 <= iav[1]):
            hit = True
        elif iop is sre.CATEGORY:
            if iav in (sre.CATEGORY_SPACE, sre.CATEGORY_NOT_WORD, sre.CATEGORY_NOT_DIGIT):
                hit = True
            elif iav in (sre.CATEGORY_DIGIT, sre.CATEGORY_WORD, sre.CATEGORY_NOT_SPACE):
                # Unicode-aware in `regex`, ASCII in hyperscan: write the class out.
                raise _UnsupportedError("`\\d`, `\\w`, `\\S` (write the ASCII class out)")
    return hit is not negate


_DIGITS = frozenset(range(48, 58))


def digit_blind(pattern: str) -> bool:
    """Whether swapping any digit of a line for another digit never changes the match.

    True when no literal is a digit and every class takes all ten digits or none: then two
    lines with the same skeleton (digits replaced by `0`) both match or both fail.
    """
    try:
        return _blind(sre_parse.parse(pattern))
    except (re.error, OverflowError, RecursionError):
        return False


def _blind(items: Any) -> bool:
    for op, av in items:
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            if av in _DIGITS:
                return False
        elif op is sre.IN:
            covered: set[int] = set()
            for iop, iav in av:
                if iop is sre.LITERAL:
                    covered |= {iav} & _DIGITS
                elif iop is sre.RANGE:
                    covered |= set(range(iav[0], iav[1] + 1)) & _DIGITS
                elif iop is sre.CATEGORY:
                    return False
            if covered and covered != _DIGITS:
                return False
        elif op is sre.SUBPATTERN:
            if not _blind(av[3]):
                return False
        elif op is sre.ATOMIC_GROUP:
            if not _blind(av):
                return False
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            if not _blind(av[2]):
                return False
        elif op is sre.BRANCH:
            if not all(_blind(alt) for alt in av[1]):
                return False
        elif op is not sre.AT:
            return False
    return True


def _adversarial(samples: Sequence[str]) -> list[str]:
    """Inputs that make a backtracking pattern blow up, if it can: long runs of one character
    where a slot starts (after a blank, mid-line), and the sample repeated."""
    inputs = ["a" * 4000 + "!", "0" * 4000 + "!", " \t" * 2000 + "!", "0." * 2000 + "x"]
    for sample in samples[:3]:
        inputs.append(" ".join([sample] * 30) + "\x00")
        cuts = [*[i + 1 for i, ch in enumerate(sample) if ch in " \t"][:6], len(sample) // 2]
        chars = sorted(set(sample) - {" ", "\t"})[:8]
        for cut in cuts:
            for ch in chars:
                inputs.append(sample[:cut] + ch * 3000 + "\x00")
    return inputs


class Validator:
    """Checks a candidate filter before use against the samples and the guard corpus."""

    def __init__(
        self, rule_examples: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.timeout = timeout
        self._fixed = [line for line in rule_examples if "\n" not in line]
        self._seen: dict[str, None] = {}

    def remember(self, line: str) -> None:
        """Add a failure line to the guard corpus (the oldest beyond `MAX_CORPUS` go)."""
        if line in self._seen:
            return
        self._seen[line] = None
        if len(self._seen) > MAX_CORPUS:
            del self._seen[next(iter(self._seen))]

    @property
    def corpus(self) -> list[str]:
        return [*self._fixed, *self._seen]

    def check(self, pattern: str, samples: Sequence[str]) -> str | None:
        """None when the candidate may be used, else why not."""
        try:
            compiled = compile_filter(pattern)
        except regex.error as exc:
            return f"does not compile: {exc}"
        try:
            literal = _check_structure(sre_parse.parse(pattern))
        except _UnsupportedError as exc:
            return f"unsupported: {exc}"
        except (re.error, OverflowError, RecursionError) as exc:
            return f"unsupported syntax: {exc}"
        if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
            return "not anchored: a filter starts with `^` and ends with `$`"
        if literal < MIN_LITERAL and not _exact(sre_parse.parse(pattern)):
            return f"over-broad: only {literal} literal characters required"
        try:
            for probe in PROBES:
                if compiled.fullmatch(probe, timeout=self.timeout):
                    return f"over-broad: matches the generic line {probe!r}"
            for sample in samples:
                if compiled.fullmatch(sample, timeout=self.timeout) is None:
                    return f"does not fullmatch its sample {sample[:200]!r}"
            # Line by line with the filter as compiled for use (a second, multi-line compile
            # of a long filter costs more than these fullmatches), within one time budget.
            deadline = time.monotonic() + self.timeout * 20
            for line in "\n".join(self.corpus).split("\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if compiled.fullmatch(line, timeout=left) is not None:
                    return f"matches a guarded line {line[:200]!r}"
            for text in _adversarial(samples):
                compiled.fullmatch(text, timeout=self.timeout)
        except TimeoutError:
            return f"too slow: over {self.timeout}s on adversarial input"
        return None
