"""Derive prefilter anchors from a rule's regexes.

An anchor set is a handful of literal strings such that every match of the pattern contains at
least one of them. The prefilter only hands a line to a rule when one of its anchors occurs, so a
rule without a usable anchor would either never fire or cost a regex run on every line.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined,unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined,unused-ignore]
from typing import Any

MIN_DERIVED = 4
"""Shorter literals are too common to make a useful prefilter."""
MIN_DECLARED = 3

_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


class AnchorError(ValueError):
    """The pattern has no literal the prefilter could use."""


def derive(pattern: str, *, ignore_case: bool = False) -> tuple[frozenset[str], bool]:
    """Return (anchors, caseless) for one pattern, or raise AnchorError."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        parsed = sre_parse.parse(pattern, flags)
    except re.error as exc:
        raise AnchorError(f"cannot derive anchors ({exc}): declare `anchors`") from exc
    caseless = bool(parsed.state.flags & re.IGNORECASE) or _adds_ignorecase(parsed)
    found = _best(list(parsed))
    if not found or min(len(s) for s in found) < MIN_DERIVED:
        raise AnchorError(
            f"no literal of {MIN_DERIVED}+ characters is required by {pattern!r}: declare `anchors`"
        )
    return frozenset(found), caseless


def _adds_ignorecase(items: Any) -> bool:
    for op, av in items:
        if op is sre.SUBPATTERN:
            if av[1] & re.IGNORECASE or _adds_ignorecase(av[3]):
                return True
        elif op is sre.BRANCH:
            if any(_adds_ignorecase(alt) for alt in av[1]):
                return True
        elif op in _REPEATS or op is sre.ATOMIC_GROUP:
            inner = av if op is sre.ATOMIC_GROUP else av[2]
            if _adds_ignorecase(inner):
                return True
    return False


def _score(anchors: set[str] | None) -> int:
    return min((len(s) for s in anchors), default=0) if anchors else 0


def _literal(op: Any, av: Any) -> str | None:
    """The exact text an item always matches, if it is a plain literal."""
    if op is sre.LITERAL:
        return chr(av)
    if op is sre.SUBPATTERN and not av[1] & re.IGNORECASE:
        parts = [_literal(o, a) for o, a in av[3]]
        if all(p is not None for p in parts):
            return "".join(p for p in parts if p is not None)
    return None


def _best(items: list[tuple[Any, Any]]) -> set[str] | None:
    """Best anchor set of a sequence: the candidate whose shortest literal is longest."""
    best: set[str] | None = None
    run: list[str] = []

    def offer(candidate: set[str] | None) -> None:
        nonlocal best
        if candidate and _score(candidate) > _score(best):
            best = candidate

    for op, av in items:
        text = _literal(op, av)
        if text is not None:
            run.append(text)
            continue
        if run:
            offer({"".join(run)})
            run = []
        if op is sre.SUBPATTERN:
            offer(_best(list(av[3])))
        elif op is sre.ATOMIC_GROUP:
            offer(_best(list(av)))
        elif op in _REPEATS and av[0] >= 1:
            offer(_best(list(av[2])))
        elif op is sre.BRANCH:
            alternatives = [_best(list(alt)) for alt in av[1]]
            if all(alternatives):
                offer(set().union(*(a for a in alternatives if a)))
    if run:
        offer({"".join(run)})
    return best
