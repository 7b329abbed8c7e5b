"""The operator's copy of the action wire models (issue 14 contract, field for field).

The service side owns the same models in `diagnoser.actions.kinds`; until it lands, the operator
keeps this copy so that it depends on nothing but the JSON contract. Unknown keys are ignored:
the service may add fields, and an older operator must still read the action."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ActionKind(StrEnum):
    CORDON_NODE = "cordon_node"
    UNCORDON_NODE = "uncordon_node"
    RESTART_JOB = "restart_job"
    NOTIFY = "notify"
    VERIFY_NODES = "verify_nodes"


class ActionState(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"
    SUPPRESSED = "suppressed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class CompletionStatus(StrEnum):
    DONE = "done"
    FAILED = "failed"


class WireModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class CordonTarget(WireModel):
    node: str
    failure_type: str
    taint_key: str = "diagnoser.io/faulty"
    taint_value: str
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class UncordonTarget(WireModel):
    node: str
    undo_of: int


class WorkloadKind(StrEnum):
    PYTORCH_JOB = "PyTorchJob"
    JOB_SET = "JobSet"
    JOB = "Job"
    POD = "Pod"


class RestartTarget(WireModel):
    namespace: str | None = None
    workload_kind: WorkloadKind | None = None
    name: str | None = None
    resume_from_step: int | None = None


class NotifyTarget(WireModel):
    audience: Literal["user", "oncall"]
    message: str
    diagnosis_url: str | None = None
    summary: str | None = None
    category: str | None = None
    failure_type: str | None = None
    culprit_nodes: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)


class VerifyTarget(WireModel):
    nodes: list[str]
    namespace: str | None = None


class Decision(WireModel):
    at: datetime
    decision: str
    reason: str


class ActionView(WireModel):
    id: int
    diagnosis_id: str
    job_id: str
    kind: ActionKind
    target: dict[str, Any]
    reason: str
    source: str
    idempotency_key: str
    state: ActionState
    depends_on: list[int] = Field(default_factory=list)
    lease_owner: str | None = None
    lease_until: datetime | None = None
    attempts: int = 0
    result: dict[str, Any] | None = None
    decisions: list[Decision] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None


class ClaimRequest(WireModel):
    operator_id: str
    kinds: list[ActionKind] | None = None
    max: int = Field(default=10, ge=1, le=100)
    lease_seconds: int = Field(default=60, ge=5, le=3600)
    wait_seconds: int = Field(default=0, ge=0, le=30)


class ClaimResponse(WireModel):
    actions: list[ActionView]


class CompleteRequest(WireModel):
    operator_id: str
    status: CompletionStatus
    message: str
    result: dict[str, Any] | None = None


class ExtendRequest(WireModel):
    operator_id: str
    lease_seconds: int = Field(default=60, ge=5, le=3600)
