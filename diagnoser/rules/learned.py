"""The learned rules file: suggested from LLM verdicts, written only when a person accepts.

Accepting a rule adds it to `learned.yaml` in the rule directory (created on first use), after
the whole directory with it has passed the same checks as `diagnoser rules check`: schema,
compilation, and every rule's examples through the engine, so a learned rule that would stop
another rule's example from firing is refused too. The file is a YAML safe dump written to a
temporary file beside it and renamed into place, so a reader (or the file watcher) never sees
half of it. Its name is fixed here, never taken from a request, so nothing can write outside
the rule directory; a `learned.yaml` that is a symbolic link is refused.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import yaml

from diagnoser.rules.loader import read_dir
from diagnoser.rules.problems import Problem, RuleLoadError
from diagnoser.rules.registry import check_files
from diagnoser.rules.schema import Rule, RuleFile

LEARNED_FILE = "learned.yaml"
LEARNED_FAMILY = "learned"
LEARNED_DESCRIPTION = (
    "Rules learned from LLM verdicts on failures no shipped rule explained, each accepted by a "
    "person (POST /v1/rules/suggestions/{id}/accept)."
)
HEADER = (
    "# Learned rules: suggested from repeated LLM verdicts, accepted by a person.\n"
    "# Written by diagnoser; edit freely (the pack is validated on every reload).\n"
)

_WRITING = threading.Lock()
"""One writer of the file at a time in this process (a read-merge-write must not interleave)."""


def dump_rule(rule: Rule) -> dict[str, Any]:
    """The rule as it is written in YAML: defaults left out, as people write rules."""
    dumped: dict[str, Any] = rule.model_dump(mode="json", exclude_defaults=True)
    return dumped


def render(rule_file: RuleFile) -> str:
    body = {
        "family": rule_file.family,
        "description": rule_file.description,
        "rules": [dump_rule(rule) for rule in rule_file.rules],
    }
    return HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=False, width=100)


def snippet(rule: Rule) -> str:
    """The rule as an entry of a file's `rules:` list, for a person to read before accepting."""
    return yaml.safe_dump([dump_rule(rule)], sort_keys=False, allow_unicode=False, width=100)


def add_rule(directory: Path, rule: Rule, *, prefilter: str = "auto") -> Path:
    """Append the rule to the directory's learned file; raise RuleLoadError if the result fails.

    A rule whose id is already in the file is left as it is (accepting twice writes once).
    """
    with _WRITING:
        path = directory / LEARNED_FILE
        if path.is_symlink():
            raise RuleLoadError([Problem(LEARNED_FILE, None, "is a symbolic link; not written")])
        files, problems = read_dir(directory)
        if problems:
            raise RuleLoadError(problems)
        current = dict(files).get(LEARNED_FILE)
        rules = current.rules if current is not None else ()
        if any(existing.id == rule.id for existing in rules):
            return path
        merged = RuleFile(
            family=current.family if current is not None else LEARNED_FAMILY,
            description=current.description if current is not None else LEARNED_DESCRIPTION,
            rules=(*rules, rule),
        )
        candidate = sorted(
            [*((name, f) for name, f in files if name != LEARNED_FILE), (LEARNED_FILE, merged)],
            key=lambda item: item[0],
        )
        problems = check_files(candidate, prefilter=prefilter)
        if problems:
            raise RuleLoadError(problems)
        text = render(merged)
        if RuleFile.model_validate(yaml.safe_load(text)) != merged:
            raise RuleLoadError([Problem(LEARNED_FILE, rule.id, "does not survive a YAML dump")])
        staging = directory / f".{LEARNED_FILE}.tmp"
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, path)
        return path
