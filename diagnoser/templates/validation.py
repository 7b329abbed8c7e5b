"""Validation of a candidate filter before use: each check's failure is the recorded reason.

In order: compiles with `regex` and uses only what both engines run identically (no lookaround,
no back-reference, no capturing group, nothing that can match a newline); not over-broad (at
least `MIN_LITERAL` non-blank literal characters in every match, no match on a few generic
lines); fullmatches every sample of its template; matches no line of the guard corpus (the rule
pack's `examples.match` lines and the failure lines seen so far); finishes within `timeout`
seconds on each adversarial input (`regex` timeout). `digit_blind` and `hex_blind` say whether
the skeleton memo of `FilterSet` may serve a filter.
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
BLANK_LINE = r"^[ \t]*$"
"""The filter of blank lines (the template of the empty line): it takes only lines without a
character of text, which no failure line is, so the generic blank probes do not make it broad.
Tracebacks and banners print blank lines by the dozen; kept, they are noise."""
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


_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_HEXISH = frozenset(b"abcdefABCDEFxX")
_X = frozenset(b"xX")
_SEP, _CHAR, _SLOT, _SKIP = range(4)
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


def hex_blind(pattern: str, absorbing: Iterable[str]) -> bool:
    """Whether swapping a hex run of a line for another never changes the match.

    A hex run is a digit, `x` and hex digits (`0x7f3a`), with no letter or digit on either side;
    the memo writes every run the same, so that NCCL's `comm 0x...` lines, a fresh pointer on
    each, share a key. Sound when the pattern is `digit_blind` and its top-level sequence is
    literals, blank runs, dot leaders and slots, where a slot is one of the `absorbing` class
    sequences (each takes any run whole and keeps matching when the run changes: `<hex>`,
    `<*>`, `<path>`, `<duration>`) or a stretch of parts none of which takes an `x` (so it
    never holds a whole run); no two slots touch (blank runs that may be empty do not part
    them); and no word of literal letters next to a slot (literals with nothing between) is
    made of hex letters and `x` alone (`add`, `face`). Then each run of a matched line lies
    inside one absorbing slot: literals alone cannot spell it (it holds a digit), and a slot
    holding only part of it would touch a slot, or a literal word inside the run, which is
    made of hex letters.
    """
    if not digit_blind(pattern):
        return False
    try:
        items = list(sre_parse.parse(pattern))
        forms = _slot_forms(tuple(absorbing))
    except (re.error, OverflowError, RecursionError):
        return False
    dumped = [_dump(item) for item in items]  # once per part, not once per slot form tried
    kinds: list[int] = []
    chars: list[int] = []
    narrow = False
    """Whether the last slot is a stretch of x-free parts (the next x-free part joins it)."""
    i = 0
    while i < len(items):
        form = next((f for f in forms if tuple(dumped[i : i + len(f)]) == f), None)
        if form is not None:
            kinds.append(_SLOT)
            chars.append(0)
            narrow = False
            i += len(form)
            continue
        op, av = items[i]
        i += 1
        kind, char = _part(op, av)
        if kind is None:
            if not _takes_no_x([(op, av)]):
                return False
            if narrow:
                while kinds[-1] == _SKIP:  # blanks inside an x-free stretch stay inside it
                    kinds.pop()
                    chars.pop()
                continue
            kind, narrow = _SLOT, True
        elif kind != _SKIP:
            narrow = False
        kinds.append(kind)
        chars.append(char)
    for i, kind in enumerate(kinds):
        if kind != _SLOT:
            continue
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(kinds) and kinds[j] == _SKIP:
                j += step
            if not 0 <= j < len(kinds) or kinds[j] == _SEP:
                continue
            if kinds[j] == _SLOT:
                return False
            word = []
            while 0 <= j < len(kinds) and kinds[j] == _CHAR:
                word.append(chars[j])
                j += step
            if all(c in _HEXISH for c in word):
                return False
    return True


@lru_cache(maxsize=16)
def _slot_forms(absorbing: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The absorbing slots' parsed forms, longest first."""
    return sorted({_dump(sre_parse.parse(p).data) for p in absorbing}, key=len, reverse=True)


def _part(op: Any, av: Any) -> tuple[int | None, int]:
    """(kind, literal byte) of one top-level part that is not a slot; kind None otherwise.

    Literal letters and digits are `_CHAR`; other literals, blank runs of at least one and dot
    leaders are `_SEP`; anchors and blank runs that may be empty are `_SKIP`.
    """
    if op is sre.LITERAL:
        return (_CHAR if av in _ALNUM else _SEP), av
    if op is sre.AT:
        return _SKIP, 0  # empty: `\b` between two slots does not part them
    if op in _REPEATS and _blank_or_dot(av[2]):
        return (_SEP if av[0] >= 1 else _SKIP), 0
    return None, 0


def _blank_or_dot(body: Any) -> bool:
    items = list(body)
    if len(items) != 1:
        return False
    op, av = items[0]
    if op is sre.LITERAL:
        return bool(av == 46)
    return op is sre.IN and all(iop is sre.LITERAL and iav in _BLANKS for iop, iav in av)


def _takes_no_x(items: Any) -> bool:
    """Whether nothing in the items can match `x` or `X`."""
    for op, av in items:
        if op is sre.LITERAL:
            if av in _X:
                return False
        elif op is sre.IN:
            for iop, iav in av:
                if iop is sre.NEGATE or iop is sre.CATEGORY:
                    return False
                if iop is sre.LITERAL and iav in _X:
                    return False
                if iop is sre.RANGE and any(iav[0] <= c <= iav[1] for c in _X):
                    return False
        elif op is sre.SUBPATTERN:
            if av[1] or not _takes_no_x(av[3]):
                return False
        elif op in _REPEATS:
            if not _takes_no_x(av[2]):
                return False
        elif op is sre.BRANCH:
            if not all(_takes_no_x(alt) for alt in av[1]):
                return False
        elif op is not sre.AT:
            return False
    return True


def _dump(value: Any) -> Any:
    """A parsed pattern as nested tuples, comparable with `==`."""
    if isinstance(value, sre_parse.SubPattern):
        return _dump(value.data)
    if isinstance(value, (list, tuple)):
        return tuple(_dump(v) for v in value)
    return value


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
        if line in self._seen or not line.strip():
            return  # a blank line is guarded only as part of a block, never for its text
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
                if pattern == BLANK_LINE and not probe.strip():
                    continue
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
