"""Rejecting rule patterns that backtrack catastrophically, when the pack loads.

A rule file can be edited at runtime (and hot-reloaded), so its patterns are untrusted. A
pattern whose structure can backtrack badly (a repeat around another repeat or around an
alternation, or syntax the check cannot read) is run, under the ruleset's timeout, on inputs
that make it blow up if it can: long runs of one character, alone and spliced into the rule's
own example after each blank. A pattern that times out is a load problem. Verdicts are cached
per (pattern, flags, example): a reload re-checks only what changed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from re import _constants as sre  # type: ignore[attr-defined,unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined,unused-ignore]
from typing import Any

import regex

RUN = 4000
"""Long enough that an exponential, cubic or slow quadratic pattern exceeds the timeout."""
RUN_CHARS = ("a", "0", " ")
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT)


def _nested(items: Any, inside_repeat: bool) -> bool:
    """A repeat (of more than one) inside a repeat, or an alternation inside one."""
    for op, av in items:
        if op in _REPEATS:
            many = av[1] > 1
            if inside_repeat and many:
                return True
            if _nested(av[2], inside_repeat or many):
                return True
        elif op is sre.SUBPATTERN:
            if _nested(av[3], inside_repeat):
                return True
        elif op is sre.BRANCH:
            if inside_repeat or any(_nested(alt, inside_repeat) for alt in av[1]):
                return True
        elif op is sre.ATOMIC_GROUP or op is sre.POSSESSIVE_REPEAT:
            continue  # no backtracking into these
    return False


def suspicious(source: str) -> bool:
    try:
        return _nested(sre_parse.parse(source), False)
    except (re.error, OverflowError, RecursionError, TypeError, ValueError):
        return True  # `regex`-only syntax: test it rather than trust it


def _inputs(example: str) -> list[str]:
    inputs = [ch * RUN + "!" for ch in (*RUN_CHARS, "\t")] + ["0." * (RUN // 2) + "x"]
    cuts = [*[i + 1 for i, ch in enumerate(example) if ch == " "][:8], len(example)]
    for cut in dict.fromkeys(cuts):
        inputs.extend(example[:cut] + ch * RUN + "\x00" for ch in RUN_CHARS)
    if example:
        inputs.append(" ".join([example] * 10) + "\x00")
    return inputs


@lru_cache(maxsize=4096)
def _too_slow(source: str, flags: int, example: str, timeout: float) -> bool:
    if not suspicious(source):
        return False
    pattern = regex.compile(source, flags)
    try:
        for text in _inputs(example):
            pattern.search(text, timeout=timeout)
    except TimeoutError:
        return True
    return False


def too_slow(pattern: regex.Pattern[str], examples: Sequence[str], timeout: float) -> bool:
    """True when `pattern` takes longer than `timeout` on one of the adversarial inputs."""
    example = next((e for e in examples if "\n" not in e), "")[:200]
    return _too_slow(pattern.pattern, pattern.flags, example, timeout)
