"""The held-back split follows its rule: by thread, deterministic, stratified, not hand-picked."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from diagnoser.evaluation.corpus import load_corpus
from diagnoser.evaluation.split import (
    Split,
    SplitCase,
    assign,
    check,
    fraction,
    mixed,
    read_pins,
    thread,
)

ROOT = Path(__file__).resolve().parents[2]
PINS = read_pins(ROOT / "evals" / "split-pins.txt")


def shipped() -> list[SplitCase]:
    return [SplitCase(c.id, c.cls, c.sources) for c in load_corpus(ROOT / "evals")]


def test_a_comment_anchor_or_trailing_slash_is_the_same_thread() -> None:
    base = "https://github.com/org/repo/issues/7"
    assert thread(base + "#issuecomment-123") == thread(base + "/") == thread(base)
    assert fraction(base + "#issuecomment-1") == fraction(base)
    assert thread(base) != thread("https://github.com/org/repo/pull/7")


def test_every_case_of_a_thread_is_on_the_same_side() -> None:
    cases = shipped()
    splits = assign(cases)
    sides: dict[str, set[Split]] = {}
    for case in cases:
        if len(case.sources) == 1:
            sides.setdefault(thread(case.sources[0]), set()).add(splits[case.id])
    assert all(len(found) == 1 for found in sides.values())


def test_a_composition_quoting_a_test_thread_is_test() -> None:
    cases = shipped()
    splits = assign(cases)
    test_threads = {
        thread(c.sources[0]) for c in cases if len(c.sources) == 1 and splits[c.id] is Split.TEST
    }
    for case in cases:
        if any(thread(url) in test_threads for url in case.sources):
            assert splits[case.id] is Split.TEST, case.id
    assert set(mixed(cases)) <= {c.id for c in cases if splits[c.id] is Split.TEST}


def test_the_shipped_split_follows_the_rule_a_third_in_test_and_every_class_tested() -> None:
    cases = load_corpus(ROOT / "evals")
    recorded = {c.id: c.split for c in cases}
    as_split = [SplitCase(c.id, c.cls, c.sources) for c in cases]
    assert check(as_split, recorded, PINS) == []
    per_class = Counter((c.cls, c.split) for c in cases)
    for cls in {c.cls for c in cases}:
        total = per_class[cls, Split.DEV] + per_class[cls, Split.TEST]
        assert per_class[cls, Split.TEST] * 3 >= total, cls


def test_adding_a_case_in_another_class_moves_no_assigned_thread() -> None:
    cases = shipped()
    before = assign(cases)
    after = assign([*cases, SplitCase("new", "brand_new_class", ("https://example.org/t/1",))])
    assert {k: v for k, v in after.items() if k != "new"} == before
    assert after["new"] is Split.TEST  # the only case of its class: topped up


def test_a_hand_edited_split_is_reported() -> None:
    cases = shipped()
    recorded = assign(cases)
    flipped = next(c for c in cases if recorded[c.id] is Split.TEST)
    recorded[flipped.id] = Split.DEV
    problems = check(cases, recorded)
    assert len(problems) == 1
    assert flipped.id in problems[0]


def test_the_script_checks_the_shipped_corpus() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "evals" / "split.py")],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "total" in result.stdout


def case_in(cls: str, n: int, url: str) -> SplitCase:
    return SplitCase(f"{cls}-{n}", cls, (url,))


def threads_by_fraction(low: float, high: float, count: int) -> list[str]:
    """Made-up thread URLs whose hash falls in [low, high): dev threads for the top-up tests."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        url = f"https://example.org/t/{n}"
        if low <= fraction(url) < high:
            found.append(url)
        n += 1
    return found


def test_a_growing_class_tops_up_from_new_threads_not_from_assigned_dev_ones() -> None:
    # Two dev threads already in the corpus (rules may have been read from them), one test.
    old = threads_by_fraction(0.4, 0.6, 2)
    hashed_test = threads_by_fraction(0.0, 0.4, 1)
    cases = [case_in("c", i, url) for i, url in enumerate(old + hashed_test)]
    before = assign(cases)
    assert [before[c.id] for c in cases] == [Split.DEV] * 2 + [Split.TEST]
    # Two new cases that hash to dev: the class now needs a second test thread.
    new = threads_by_fraction(0.6, 1.0, 2)
    grown = cases + [case_in("c", 10 + i, url) for i, url in enumerate(new)]
    assert assign(grown)[cases[0].id] is Split.TEST, "without the preference, an old one moves"
    after = assign(grown, new=new)
    assert all(after[c.id] is before[c.id] for c in cases), "an assigned case moved"
    assert sum(after[c.id] is Split.TEST for c in grown) * 3 >= len(grown)


def test_a_pinned_top_up_stays_in_test_when_it_is_no_longer_needed() -> None:
    dev = threads_by_fraction(0.4, 1.0, 2)
    cases = [case_in("c", i, url) for i, url in enumerate(dev)]
    first = assign(cases)
    topped = [thread(c.sources[0]) for c in cases if first[c.id] is Split.TEST]
    assert len(topped) == 1
    # Later the class gains cases that hash to test: the top-up is no longer needed.
    more = [case_in("c", 10 + i, url) for i, url in enumerate(threads_by_fraction(0, 0.4, 3))]
    grown = cases + more
    assert all(assign(grown)[c.id] is Split.DEV for c in cases), "unpinned, it would leave test"
    pinned = assign(grown, pinned=topped)
    assert all(pinned[c.id] is first[c.id] for c in cases)
    assert check(grown, pinned, topped) == []
