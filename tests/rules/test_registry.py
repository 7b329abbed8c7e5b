"""Hot reload keeps the old rule set on errors; the digest follows content, not formatting."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import RuleLoadError, RuleRegistry, load_dir, scan_lines
from tests.rules.conftest import MINIMAL_RULE, write_rules


def test_reload_swaps_in_a_valid_set(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    registry = RuleRegistry(tmp_path)
    before = registry.digest
    write_rules(
        tmp_path, "demo.yaml", MINIMAL_RULE.replace("severity: error", "severity: critical")
    )
    fresh = registry.reload()
    assert registry.active is fresh
    assert registry.digest != before


def test_broken_file_keeps_the_previous_set(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    registry = RuleRegistry(tmp_path)
    active, digest = registry.active, registry.digest
    write_rules(
        tmp_path,
        "broken.yaml",
        MINIMAL_RULE.replace("demo_disk_full", "other").replace("patterns:", "patternz:"),
    )
    with pytest.raises(RuleLoadError) as info:
        registry.reload()
    assert "broken.yaml: rule 'other': unknown key 'patternz'" in str(info.value)
    assert registry.active is active
    assert registry.digest == digest
    events = scan_lines(registry.active, ["OSError: [Errno 28] No space left on device"])
    assert [e.rule_id for e in events] == ["demo_disk_full"]


def test_digest_ignores_comments_and_layout(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    first = RuleRegistry(tmp_path).digest
    write_rules(
        tmp_path,
        "demo.yaml",
        "# a comment\n" + MINIMAL_RULE.replace("    scope: job\n", "    scope:   job   \n"),
    )
    assert RuleRegistry(tmp_path).digest == first


def test_scan_lines_reports_rule_and_line(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    lines = ["ok"] * 5000 + ["OSError: [Errno 28] No space left on device"]
    (event,) = scan_lines(RuleRegistry(tmp_path).active, lines)
    assert (event.rule_id, event.line_no) == ("demo_disk_full", 5001)


def test_a_set_compiled_before_start_is_used_only_while_the_files_match(tmp_path: Path) -> None:
    write_rules(tmp_path, "demo.yaml", MINIMAL_RULE)
    compiled = load_dir(tmp_path)
    assert RuleRegistry(tmp_path, compiled=compiled).active is compiled
    write_rules(
        tmp_path, "demo.yaml", MINIMAL_RULE.replace("severity: error", "severity: critical")
    )
    registry = RuleRegistry(tmp_path, compiled=compiled)
    assert registry.active is not compiled, "the files changed after the set was compiled"
    assert registry.digest == load_dir(tmp_path).digest
