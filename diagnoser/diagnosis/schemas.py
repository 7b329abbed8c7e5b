"""The on-call API's contracts: diagnoses, feedback, nodes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FeedbackKind
    author: str = Field(min_length=1, max_length=253)
    comment: str = Field(default="", max_length=10_000)
    category: Category | None = Field(default=None, description="override only")
    action: Action | None = Field(default=None, description="override only")


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
