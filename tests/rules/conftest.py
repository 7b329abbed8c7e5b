"""Shared rule-pack fixtures: the shipped pack compiled once per session, on each prefilter."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import RuleSet, load_dir

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"
FIXTURES_DIR = ROOT / "tests" / "fixtures" / "logs"


@pytest.fixture(scope="session")
def pack() -> RuleSet:
    return load_dir(RULES_DIR, prefilter="hyperscan")


@pytest.fixture(scope="session")
def pack_regex() -> RuleSet:
    return load_dir(RULES_DIR, prefilter="regex")


def write_rules(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(body, encoding="utf-8")
    return path


MINIMAL_RULE = """\
family: demo
description: a tiny rule file for tests
rules:
  - id: demo_disk_full
    description: a write failed for lack of space
    failure_type: disk_full
    category: storage
    severity: error
    scope: job
    action: notify_user
    patterns: ['No space left on device']
    examples:
      match: ['OSError: [Errno 28] No space left on device']
      no_match: ['plenty of space']
"""
