"""The slice of the operator API's wire models that the notifier reads, as a client reads them.

The notifier takes actions from the outbox in process or over HTTP (`api_queue.py`), so it reads
them as any client of the API does: the contract's field names, unknown keys ignored (the
service may add fields; adding is allowed, renaming is not). `diagnoser.actions.kinds` is the
service's own, strict side of the same JSON.

The service fills the `notify` target's `family`, `namespace` and `action` from the job's
metadata; `severity` is optional, else derived from the audience.
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
