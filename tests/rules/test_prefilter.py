"""The hyperscan and pure-regex prefilters give identical candidates and identical events."""

from __future__ import annotations

import pytest

from diagnoser.rules import RuleSet, scan_lines
from diagnoser.rules.anchors import AnchorError, derive
from diagnoser.rules.prefilter import Anchor, HyperscanPrefilter, RegexPrefilter
from tests.rules.conftest import FIXTURES_DIR, RULES_DIR
from tests.templates.corpus import LOGHUB


def _corpus() -> list[str]:
    lines: list[str] = []
    for path in sorted(LOGHUB.glob("*/*.log")):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    for path in sorted(FIXTURES_DIR.glob("*.log")):
        lines += path.read_text(encoding="utf-8").splitlines()
    for path in sorted(RULES_DIR.glob("*.yaml")):
        lines += path.read_text(encoding="utf-8").splitlines()
    # Case and non-ASCII edge cases around caseless anchors.
    lines += [
        "LOSS: NAN",
        "loss=İnf",
        "K\u212a loss: nan",
        "",
        "ünïcode NVRM: Xid (PCI:0000:01:00): 79",
    ]
    return lines


def test_candidates_are_identical(pack: RuleSet, pack_regex: RuleSet) -> None:
    lines = _corpus()
    assert len(lines) > 30_000
    for start in range(0, len(lines), 4096):
        chunk = lines[start : start + 4096]
        assert pack.prefilter.candidates(chunk) == pack_regex.prefilter.candidates(chunk)


def test_events_are_identical(pack: RuleSet, pack_regex: RuleSet) -> None:
    lines = _corpus()
    fast = scan_lines(pack, lines)
    slow = scan_lines(pack_regex, lines)
    assert fast == slow
    assert len(fast) > 50


@pytest.mark.parametrize("kind", [HyperscanPrefilter, RegexPrefilter])
def test_line_mapping_and_case(kind: type[HyperscanPrefilter] | type[RegexPrefilter]) -> None:
    prefilter = kind(
        [Anchor("Xid", False, 1), Anchor("out of memory", True, 2), Anchor("Xid (", False, 4)]
    )
    lines = ["nothing", "NVRM: Xid (PCI", "", "CUDA OUT OF MEMORY", "xid lower", "Xid Xid"]
    assert prefilter.candidates(lines) == {1: 5, 3: 2, 5: 1}


def test_anchor_derivation() -> None:
    anchors, caseless = derive(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]+)\): (?P<xid>79)\b")
    assert anchors == {"NVRM: Xid ("}
    assert not caseless
    anchors, _ = derive(r"Connection (?:closed by remote peer|reset by peer)")
    assert anchors == {"closed by remote peer", "reset by peer"}
    assert derive(r"(?i)loss is nan")[1] is True
    with pytest.raises(AnchorError):
        derive(r"\d+: \w+")


def test_candidates_do_not_depend_on_where_a_line_sits_in_the_chunk(
    pack: RuleSet, pack_regex: RuleSet
) -> None:
    """Hyperscan 0.9.1 misses some regex matches past a certain offset of a chunk (see
    tests/templates/test_filters.py); the literal anchors here are scanned another way, and
    every example line of the pack is flagged at every offset as the regex prefilter flags it."""
    examples = [
        line
        for rule in pack.rules
        for example in rule.spec.examples.match
        for line in example.splitlines()
    ]
    assert len(examples) > 300
    flagged = sum(1 in pack.prefilter.candidates(["", line]) for line in examples)
    assert flagged > 300
    # The regex prefilter reads line by line, so its answer does not depend on the offset: it
    # is computed once per example (a filler line of x's is no candidate), hyperscan's per offset.
    expected = [pack_regex.prefilter.candidates(["x", line]) for line in examples]
    for width in [*range(80), 200, 1000, 5000]:
        assert pack_regex.prefilter.candidates(["x" * width]) == {}
        for line, wanted in zip(examples, expected, strict=True):
            assert pack.prefilter.candidates(["x" * width, line]) == wanted, (width, line)
