"""What the engine emits: one plain frozen record per rule match (no pydantic on the hot path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnoser.rules.schema import Action, Category, Scope, Severity


@dataclass(frozen=True, slots=True)
class RuleEvent:
    """A rule fired on a line, or on an assembled multi-line block.

    `offset` and `line_no` locate `text` in its stream. For a traceback, `text` is the final
    exception line and `evidence` the lines before it; for a ChildFailedError block, `text` is
    the parsed summary, `offset`/`line_no` its first line, and `evidence` the raw block.
    `time` is the timestamp parsed from the line when it carries an ISO-8601 one, else the
    caller's `now`.
    """

    rule_id: str
    failure_type: str
    category: Category
    action: Action
    severity: Severity
    scope: Scope
    entities: dict[str, str]
    text: str
    offset: int
    line_no: int
    node: str
    rank: int | None
    time: float
    evidence: tuple[str, ...] = field(default=())
