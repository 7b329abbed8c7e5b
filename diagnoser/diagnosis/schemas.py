"""The on-call API's contracts: diagnoses, feedback, nodes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from diagnoser.rules import Action, Category


class DiagnosisStatus(StrEnum):
    OPEN = "open"
    ACTIONED = "actioned"
    RESOLVED = "resolved"
    DISMISSED = "dismissed"


class Evidence(BaseModel):
    node: str
    rank: int | None
    time: float
    offset: int
    line_no: int
    rule_id: str
    text: str
    context: list[str] = Field(default_factory=list, description="Lines before it (frames...).")


class DiagnosisView(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    job_id: str
    created_at: datetime
    updated_at: datetime
    status: DiagnosisStatus
    failure_type: str | None
    category: str | None
    summary: str
    culprit_nodes: list[str]
    affected_ranks: list[int]
    source: str
    rule_ids: list[str]
    confidence: float
    evidence: list[Evidence]
    action: str
    progress: dict[str, Any] | None
    ruleset_digest: str | None
    llm: dict[str, Any] | None = Field(description="Votes, model and prompt version, if any.")


class DiagnosisPage(BaseModel):
    diagnoses: list[DiagnosisView]
    next_cursor: str | None


class FeedbackKind(StrEnum):
    CONFIRM = "confirm"
    OVERRIDE = "override"
    DISMISS = "dismiss"
    RESOLVE = "resolve"


_NOT_NULL: JsonDict = {"not": {"type": "null"}}
_OVERRIDE_RULE: JsonDict = {
    "anyOf": [
        {
            "properties": {"kind": {"const": "override"}},
            "anyOf": [
                {"required": ["category"], "properties": {"category": _NOT_NULL}},
                {"required": ["action"], "properties": {"action": _NOT_NULL}},
            ],
        },
        {
            "properties": {
                "kind": {"enum": ["confirm", "dismiss", "resolve"]},
                "category": {"type": "null"},
                "action": {"type": "null"},
            }
        },
    ]
}
"""The rule of `_override_names_what`, for clients and fuzzers that read the schema."""


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_OVERRIDE_RULE)

    kind: FeedbackKind
    author: str = Field(min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f]+$")
    """No control characters: the author is shown on one line."""
    comment: str = Field(
        default="", max_length=10_000, pattern=r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
    )
    """Free text; tabs and newlines, no other control characters (PostgreSQL refuses NUL)."""
    category: Category | None = Field(default=None, description="override only")
    action: Action | None = Field(default=None, description="override only")

    @model_validator(mode="after")
    def _override_names_what(self) -> FeedbackIn:
        named = self.category is not None or self.action is not None
        if self.kind is FeedbackKind.OVERRIDE and not named:
            raise ValueError("an override names a category or an action")
        if self.kind is not FeedbackKind.OVERRIDE and named:
            raise ValueError("category and action go with kind=override")
        return self


class FeedbackView(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    diagnosis_id: str
    kind: str
    category: str | None
    action: str | None
    author: str
    comment: str
    created_at: datetime


class NodeSummary(BaseModel):
    node: str
    incidents: int
    last_incident_at: datetime | None
    last_failure_type: str | None
    cordon_recommended: bool
    """An open or actioned diagnosis recommends cordoning this node."""


class NodeDetail(NodeSummary):
    history: list[DiagnosisView]
