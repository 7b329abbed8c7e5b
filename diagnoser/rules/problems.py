"""What is wrong with a rule directory, said so that a person can fix it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    rule_id: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: rule {self.rule_id!r}" if self.rule_id else self.file
        return f"{where}: {self.message}"


class RuleLoadError(ValueError):
    """A rule directory failed validation; the previously active rule set stays in place."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the rule files:\n{lines}")
