"""The held-back split: which cases are `dev` (rules may be written from them) and which are
`test` (scored, never read to write or tune a rule).

The unit is the source thread, never the case: every case quoting a thread lands on the same
side, so a rule written from one comment of a thread cannot score on another. A thread is in
`test` when a salted SHA-256 of its normalised URL, read as a fraction of 2**256, is below
`TEST_SHARE`. That depends on the URL alone: adding cases never moves an assigned thread, and
nobody picks. A composition of several threads (a `multi_node` case) is `test` when any of its
threads is, so no test thread is ever read through a composition.

Stratified by class: a class whose test share falls below a third after the hash (a small class
can draw few test threads) moves dev threads into test, one whole thread at a time, until a third
of its cases are test. Threads new to the corpus go first (lowest fraction first), threads already
in it only when the new ones are not enough, so growing a class does not pull in a dev thread that
rules may have been written from. Every thread a top-up has put in test is pinned
(`evals/split-pins.txt`), so a later top-up that is no longer needed never takes it out of test
again: a thread's side, once assigned, does not change when cases are added. The command prints
every case whose split changes, so any move of an assigned case is seen before it is written.

Pure: `assign` maps case ids to splits; `check` says where a corpus breaks the rule. The
command-line entry is `evals/split.py`.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

SALT = "diagnoser-evals-split-v1"
"""Fixed once, before any rule was written against the split; changing it reshuffles the split
and makes every earlier test score meaningless."""
TEST_SHARE = 0.4
"""Share of threads the hash puts in test."""
MIN_TEST_SHARE = 1 / 3
"""Each class (and so the corpus) ends with at least this share of its cases in test."""


class Split(StrEnum):
    DEV = "dev"
    TEST = "test"


@dataclass(frozen=True, slots=True)
class SplitCase:
    """What the rule needs of a case: its id, its class and the threads it quotes."""

    id: str
    cls: str
    sources: tuple[str, ...]


def thread(url: str) -> str:
    """The thread a source URL belongs to: scheme and host lower-cased; fragment (a comment
    anchor), query and trailing slash dropped."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, "", ""))


def fraction(url: str) -> float:
    """The thread's position in [0, 1): salted SHA-256 of its normalised URL."""
    digest = hashlib.sha256(f"{SALT}\n{thread(url)}".encode()).digest()
    return int.from_bytes(digest, "big") / 2**256


def split_of(cases: Iterable[SplitCase], test_threads: set[str]) -> dict[str, Split]:
    """Case id -> split, given the test threads."""
    return {
        case.id: (
            Split.TEST if any(thread(url) in test_threads for url in case.sources) else Split.DEV
        )
        for case in cases
    }


def test_threads(cases: Sequence[SplitCase], pinned: Iterable[str], new: Iterable[str]) -> set[str]:
    """The threads in test: hashed below `TEST_SHARE`, the `pinned` earlier top-ups, topped up per
    class (see above), preferring the `new` threads (those not yet in the corpus)."""
    chosen = {
        thread(url)
        for case in cases
        for url in case.sources
        if fraction(url) < TEST_SHARE
    }  # fmt: skip
    chosen |= {thread(url) for url in pinned}
    fresh = {thread(url) for url in new}
    by_class: defaultdict[str, list[SplitCase]] = defaultdict(list)
    for case in cases:
        by_class[case.cls].append(case)
    for cls in sorted(by_class):
        members = by_class[cls]
        need = math.ceil(MIN_TEST_SHARE * len(members))
        candidates = sorted(
            {thread(url) for case in members for url in case.sources} - chosen,
            key=lambda url: (url not in fresh, fraction(url)),
        )
        for candidate in candidates:
            splits = split_of(members, chosen)
            if sum(split is Split.TEST for split in splits.values()) >= need:
                break
            chosen.add(candidate)
    return chosen


def assign(
    cases: Sequence[SplitCase], pinned: Iterable[str] = (), new: Iterable[str] = ()
) -> dict[str, Split]:
    """Case id -> split: `test` when any thread the case quotes is a test thread."""
    return split_of(cases, test_threads(cases, pinned, new))


def pins(chosen: Iterable[str]) -> list[str]:
    """The test threads that are there by a top-up rather than by their hash: what
    `evals/split-pins.txt` records, sorted, so that they stay in test however the corpus grows."""
    return sorted(url for url in set(chosen) if fraction(url) >= TEST_SHARE)


def read_pins(path: Path) -> list[str]:
    """The pinned top-up threads of `evals/split-pins.txt` (one URL a line, `#` comments); none
    when the file is absent."""
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def mixed(cases: Sequence[SplitCase], pinned: Iterable[str] = ()) -> list[str]:
    """Compositions that quote threads of both splits (in test by the rule)."""
    chosen = test_threads(cases, pinned, ())
    return sorted(
        case.id for case in cases if len({thread(url) in chosen for url in case.sources}) > 1
    )


def check(
    cases: Sequence[SplitCase], recorded: Mapping[str, Split], pinned: Iterable[str] = ()
) -> list[str]:
    """Problems with a corpus's recorded splits (empty: it follows the rule)."""
    pinned = list(pinned)
    expected = assign(cases, pinned)
    problems = [
        f"{case.id}: split is {recorded.get(case.id, 'missing')}, the rule says "
        f"{expected[case.id]} (thread {', '.join(thread(u) for u in case.sources)})"
        for case in cases
        if recorded.get(case.id) is not expected[case.id]
    ]
    by_class: defaultdict[str, list[Split]] = defaultdict(list)
    for case in cases:
        by_class[case.cls].append(expected[case.id])
    problems.extend(
        f"class {cls}: no test case" for cls, splits in sorted(by_class.items())
        if Split.TEST not in splits
    )  # fmt: skip
    tested = sum(split is Split.TEST for split in expected.values())
    if cases and tested < MIN_TEST_SHARE * len(cases):
        problems.append(f"only {tested} of {len(cases)} cases in test (at least a third needed)")
    return problems
