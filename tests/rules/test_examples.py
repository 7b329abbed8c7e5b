"""Every rule's own examples, through the whole pipeline, on both prefilters."""

from __future__ import annotations

import pytest

from diagnoser.rules import RuleSet, scan_lines
from diagnoser.rules.loader import read_dir
from tests.rules.conftest import RULES_DIR

_FILES, _PROBLEMS = read_dir(RULES_DIR)
CASES = [
    pytest.param(rule.id, expected, example, id=f"{rule.id}-{kind}{i}")
    for _, rule_file in _FILES
    for rule in rule_file.rules
    for expected, kind, examples in (
        (True, "match", rule.examples.match),
        (False, "no_match", rule.examples.no_match),
    )
    for i, example in enumerate(examples)
]


def test_pack_files_are_valid() -> None:
    assert _PROBLEMS == []
    assert len(CASES) > 100


@pytest.mark.parametrize(("rule_id", "expected", "example"), CASES)
def test_rule_example(
    pack: RuleSet, pack_regex: RuleSet, rule_id: str, expected: bool, example: str
) -> None:
    for ruleset in (pack, pack_regex):
        events = scan_lines(ruleset, example.rstrip("\n").split("\n"))
        fired = [e.rule_id for e in events]
        assert (rule_id in fired) is expected, (ruleset.prefilter.name, fired)
