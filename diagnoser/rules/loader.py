"""Read and validate a rule directory (`rules/*.yaml`) into a compiled RuleSet."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from diagnoser.rules.problems import Problem, RuleLoadError
from diagnoser.rules.ruleset import DEFAULT_TIMEOUT, RuleSet
from diagnoser.rules.schema import RuleFile

try:  # libyaml parses the pack about ten times faster; service start pays for it
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # a PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _StrictLoader(_SafeLoader):
    """SafeLoader that refuses duplicate keys instead of silently keeping the last one."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_file(path: Path) -> tuple[RuleFile | None, list[Problem]]:
    name = path.name
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, [Problem(name, None, f"cannot read: {exc}")]
    try:
        return RuleFile.model_validate(raw), []
    except ValidationError as exc:
        return None, [_describe(name, raw, error) for error in exc.errors()]


def _describe(file: str, raw: object, error: Any) -> Problem:
    loc: tuple[Any, ...] = tuple(error["loc"])
    rule_id: str | None = None
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int) and isinstance(raw, dict):
        rules = raw.get("rules")
        if isinstance(rules, list) and loc[1] < len(rules) and isinstance(rules[loc[1]], dict):
            found = rules[loc[1]].get("id")
            rule_id = str(found) if found is not None else f"#{loc[1] + 1}"
        loc = loc[2:]
    where = ".".join(str(part) for part in loc)
    if error["type"] == "extra_forbidden":
        message = f"unknown key {str(loc[-1])!r}"
    else:
        message = f"{where}: {error['msg']}" if where else str(error["msg"])
    return Problem(file, rule_id, message)


def read_dir(directory: Path) -> tuple[list[tuple[str, RuleFile]], list[Problem]]:
    """Validate every `*.yaml` file; problems from all files are collected, not just the first."""
    if not directory.is_dir():
        return [], [Problem(str(directory), None, "not a directory")]
    files: list[tuple[str, RuleFile]] = []
    problems: list[Problem] = []
    root = directory.resolve()
    for path in sorted(directory.glob("*.yaml")):
        if not path.resolve().is_relative_to(root) or not path.is_file():
            problems.append(Problem(path.name, None, "not a file inside the rule directory"))
            continue
        rule_file, file_problems = read_file(path)
        problems.extend(file_problems)
        if rule_file is not None:
            files.append((path.name, rule_file))
    if not files and not problems:
        problems.append(Problem(str(directory), None, "no *.yaml rule files"))
    return files, problems


def digest(files: list[tuple[str, RuleFile]]) -> str:
    """sha256 over each validated file's canonical JSON: formatting and comments do not count."""
    h = hashlib.sha256()
    for name, rule_file in files:
        h.update(name.encode())
        h.update(b"\0")
        h.update(json.dumps(rule_file.model_dump(mode="json"), sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


def load_dir(
    directory: Path, *, prefilter: str = "auto", timeout: float = DEFAULT_TIMEOUT
) -> RuleSet:
    """Validate and compile a rule directory, or raise RuleLoadError (file, rule, reason)."""
    files, problems = read_dir(directory)
    if problems:
        raise RuleLoadError(problems)
    return RuleSet(files, digest(files), prefilter=prefilter, timeout=timeout)
