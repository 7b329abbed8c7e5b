"""Rule files are strict: unknown keys, wrong vocabularies and unusable patterns are refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnoser.rules import RuleLoadError, check, load_dir
from diagnoser.rules.schema import FAILURE_TYPES, json_schema
from tests.rules.conftest import MINIMAL_RULE, ROOT, RULES_DIR, write_rules


def _error(tmp_path: Path, body: str) -> str:
    write_rules(tmp_path, "demo.yaml", body)
    with pytest.raises(RuleLoadError) as info:
        load_dir(tmp_path)
    return str(info.value)


def test_minimal_file_loads(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    assert [r.id for r in load_dir(tmp_path).rules] == ["demo_disk_full"]


def test_unknown_key_names_file_rule_and_key(tmp_path: Path) -> None:
    message = _error(
        tmp_path, MINIMAL_RULE.replace("    scope: job\n", "    scope: job\n    sevrity: high\n")
    )
    assert "demo.yaml: rule 'demo_disk_full': unknown key 'sevrity'" in message


def test_unknown_category_is_refused(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL_RULE.replace("category: storage", "category: disks"))
    assert "demo.yaml: rule 'demo_disk_full': category" in message


def test_category_must_match_the_failure_type(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL_RULE.replace("category: storage", "category: hardware"))
    assert "belongs to category 'storage'" in message


def test_looser_action_needs_a_reason(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL_RULE.replace("action: notify_user", "action: none"))
    assert "looser than the default" in message


def test_failure_type_outside_the_taxonomy_is_refused(tmp_path: Path) -> None:
    message = _error(
        tmp_path, MINIMAL_RULE.replace("failure_type: disk_full", "failure_type: disk_sad")
    )
    assert "not in docs/failure-taxonomy.md" in message


def test_pattern_without_anchor_is_refused(tmp_path: Path) -> None:
    body = MINIMAL_RULE.replace("patterns: ['No space left on device']", r"patterns: ['\d+ \w+']")
    assert "declare `anchors`" in _error(tmp_path, body)


def test_invalid_regex_names_the_pattern(tmp_path: Path) -> None:
    body = MINIMAL_RULE.replace(
        "patterns: ['No space left on device']", "patterns: ['No space (left']"
    )
    assert "patterns[0]: invalid regex" in _error(tmp_path, body)


def test_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    body = MINIMAL_RULE.replace("    scope: job\n", "    scope: job\n    scope: node\n")
    assert "duplicate key 'scope'" in _error(tmp_path, body)


def test_duplicate_rule_id_across_files(tmp_path: Path) -> None:
    write_rules(tmp_path, "a.yaml", MINIMAL_RULE)
    write_rules(tmp_path, "b.yaml", MINIMAL_RULE)
    with pytest.raises(RuleLoadError, match=r"b\.yaml: rule 'demo_disk_full': duplicate id"):
        load_dir(tmp_path)


def test_window_field_must_be_captured(tmp_path: Path) -> None:
    body = MINIMAL_RULE.replace(
        "    examples:", "    window: {count: 2, seconds: 60, same: [pci]}\n    examples:"
    )
    assert "lacks named group(s) ['pci']" in _error(tmp_path, body)


def test_check_reports_failing_examples(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        "demo.yaml",
        MINIMAL_RULE.replace(
            "no_match: ['plenty of space']", "no_match: ['No space left on device']"
        ),
    )
    problems = check(tmp_path)
    assert [(p.file, p.rule_id) for p in problems] == [("demo.yaml", "demo_disk_full")]
    assert "no_match example fired" in problems[0].message


def test_shipped_pack_passes_check() -> None:
    assert check(RULES_DIR) == []


def test_schema_json_is_up_to_date() -> None:
    assert (RULES_DIR / "schema.json").read_text(encoding="utf-8") == json_schema(), (
        "regenerate: python -c 'from diagnoser.rules.schema import json_schema; "
        'open("rules/schema.json", "w").write(json_schema())\''
    )


def test_taxonomy_doc_and_code_agree() -> None:
    doc = (ROOT / "docs" / "failure-taxonomy.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (\w+) \| (\w+) \|", doc, flags=re.MULTILINE)
    table = {name: (category, action) for name, category, action in rows if category != "-"}
    code = {name: (c.value, a.value) for name, (c, a) in FAILURE_TYPES.items()}
    assert table == code
