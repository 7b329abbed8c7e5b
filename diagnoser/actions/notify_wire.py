"""The slice of the operator API's wire models that the notifier reads.

A stand-in for `diagnoser.actions.kinds` until that module lands: the field names are the
contract's, so the integrator can swap the import. Unknown keys are ignored, because the
service may add fields (adding is allowed, renaming is not).

`NotifyTarget` extends the contract's `notify` target with optional `family`, `namespace`,
`action` and `severity`, which routing and the PagerDuty severity use when the service fills
them; without them the family is derived from the job id and the severity from the audience.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NOTIFY_KIND = "notify"

Audience = Literal["user", "oncall"]
Severity = Literal["critical", "error", "warning", "info"]


class Decision(BaseModel):
    model_config = ConfigDict(extra="ignore")

    at: datetime
    decision: str
    reason: str


class ActionView(BaseModel):
    """One action as the operator API returns it."""

    model_config = ConfigDict(extra="ignore")

    id: int
    diagnosis_id: str
    job_id: str
    kind: str
    target: dict[str, Any]
    reason: str
    source: str
    idempotency_key: str
    state: str
    depends_on: list[int] = Field(default_factory=list)
    lease_owner: str | None = None
    lease_until: datetime | None = None
    attempts: int = 0
    result: dict[str, Any] | None = None
    decisions: list[Decision] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None


class NotifyTarget(BaseModel):
    """The `target` of a `notify` action."""

    model_config = ConfigDict(extra="ignore")

    audience: Audience
    message: str
    diagnosis_url: str | None = None
    summary: str = ""
    category: str | None = None
    failure_type: str | None = None
    culprit_nodes: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    family: str | None = None
    namespace: str | None = None
    action: str | None = None
    """The diagnosis's recommended recovery (`cordon_node_and_restart`, ...)."""
    severity: Severity | None = None
