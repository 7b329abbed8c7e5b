"""Rejecting rule patterns that backtrack catastrophically, when the pack loads.

A rule file can be edited at runtime (and hot-reloaded), so its patterns are untrusted: each one
is run, under the ruleset's timeout, on a few inputs that make a backtracking pattern blow up
if it can (long runs of one character, alone and spliced into the rule's own example). A pattern
that times out is a load problem. Verdicts are cached per (pattern, flags): a reload re-checks
only what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import regex

RUN = 1000
"""Long enough that an exponential or cubic pattern times out; a quadratic one costs a few ms."""


def _inputs(example: str) -> list[str]:
    inputs = [ch * RUN + "!" for ch in ("a", "0", " ", "\t")] + ["0." * (RUN // 2) + "x"]
    if example:
        cut = len(example) // 2
        blank = example.find(" ") + 1 or cut
        for ch in dict.fromkeys(c for c in example if not c.isspace()):
            inputs.append(example[:blank] + ch * RUN + "\x00")
            if len(inputs) >= 8:
                break
        inputs.append(" ".join([example] * 10) + "\x00")
    return inputs


@lru_cache(maxsize=4096)
def _too_slow(source: str, flags: int, example: str, timeout: float) -> bool:
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
