"""The wire contract between the service and operators (docs/actions.md, issue 14).

These models are all an operator imports from the service side: the kinds of action, their
targets, the action as the API shows it, and the bodies of claim, complete and extend.
Fields are only ever added, never renamed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

OPERATOR_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,252}$"
TAINT_KEY = "diagnoser.io/faulty"
MAX_EVIDENCE_LINES = 20


def _not_bool(value: object) -> object:
    """JSON `true` is not 1 second: a boolean where a number belongs is a client bug."""
    if isinstance(value, bool):
        raise ValueError("a number, not a boolean")
    return value


Whole = Annotated[int, BeforeValidator(_not_bool)]


class ActionKind(StrEnum):
    CORDON_NODE = "cordon_node"
    UNCORDON_NODE = "uncordon_node"
    RESTART_JOB = "restart_job"
    NOTIFY = "notify"
    VERIFY_NODES = "verify_nodes"


NODE_KINDS = frozenset({ActionKind.CORDON_NODE, ActionKind.VERIFY_NODES})
"""Kinds that take nodes out of service (or may): the blast radius counts and caps them."""


class ActionState(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"
    SUPPRESSED = "suppressed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset(
    {
        ActionState.DONE,
        ActionState.FAILED,
        ActionState.SUPPRESSED,
        ActionState.EXPIRED,
        ActionState.CANCELLED,
    }
)


class Audience(StrEnum):
    USER = "user"
    ONCALL = "oncall"


class CordonTarget(BaseModel):
    node: str
    failure_type: str | None = None
    taint_key: str = TAINT_KEY
    taint_value: str | None = None
    taint_effect: str = "NoSchedule"


class UncordonTarget(BaseModel):
    node: str
    undo_of: int
    """The cordon action whose changes to the Node this removes, exactly."""


class RestartTarget(BaseModel):
    """From the job's metadata (PUT /v1/jobs/{id}); None when unknown: the operator then
    selects pods by the label `diagnoser.io/job=<job_id>`."""

    namespace: str | None = None
    workload_kind: Literal["PyTorchJob", "JobSet", "Job", "Pod"] | None = None
    name: str | None = None
    resume_from_step: int | None = None


class NotifyTarget(BaseModel):
    audience: Audience
    message: str
    diagnosis_url: str | None = None
    summary: str = ""
    category: str | None = None
    failure_type: str | None = None
    culprit_nodes: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list, max_length=MAX_EVIDENCE_LINES)
    """At most 20 lines, redacted as the LLM stage redacts them."""
    family: str | None = None
    """The job's family and namespace (its metadata): the notifier routes by them."""
    namespace: str | None = None
    action: str | None = None
    """The diagnosis's recommended recovery (`cordon_node_and_restart`, ...)."""
    resume_from_step: int | None = None
    """The last checkpoint step, when known."""


class VerifyTarget(BaseModel):
    nodes: list[str]
    namespace: str | None = None


class VerifyResult(BaseModel):
    """What an operator completes a `verify_nodes` action with."""

    failed_nodes: list[str] = Field(default_factory=list)
    rounds: list[Any] = Field(default_factory=list)


Target = CordonTarget | UncordonTarget | RestartTarget | NotifyTarget | VerifyTarget
TARGETS: dict[ActionKind, type[BaseModel]] = {
    ActionKind.CORDON_NODE: CordonTarget,
    ActionKind.UNCORDON_NODE: UncordonTarget,
    ActionKind.RESTART_JOB: RestartTarget,
    ActionKind.NOTIFY: NotifyTarget,
    ActionKind.VERIFY_NODES: VerifyTarget,
}


class Decision(BaseModel):
    """One policy (or lifecycle) decision on an action, with why: the audit trail."""

    at: datetime
    decision: str
    reason: str


class ActionView(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    diagnosis_id: str
    job_id: str
    kind: ActionKind
    target: dict[str, Any]
    """The kind's target (CordonTarget, RestartTarget, ...): `parsed_target()` types it."""
    reason: str
    source: str
    """Who decided the diagnosis: `rules` (rules or correlation), `llm`, `human`, `policy`."""
    idempotency_key: str
    state: ActionState
    depends_on: list[int]
    lease_owner: str | None
    lease_until: datetime | None
    attempts: int
    result: dict[str, Any] | None
    decisions: list[Decision]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    not_before: datetime | None = None
    """Restart backoff: not claimable before this time."""
    released: bool = False
    """The policy released it to operators (false in dry-run and while suppressed)."""
    message: str | None = None
    """The operator's completion message."""

    def parsed_target(self) -> Target:
        model = TARGETS[self.kind]
        parsed: Target = model.model_validate(self.target)  # type: ignore[assignment]
        return parsed


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operator_id: str = Field(pattern=OPERATOR_ID_PATTERN)
    kinds: list[ActionKind] | None = Field(default=None, max_length=len(ActionKind))
    """None: every kind."""
    max: Whole = Field(default=10, ge=1, le=100)
    lease_seconds: Whole = Field(default=60, ge=5, le=3600)
    wait_seconds: Whole = Field(default=0, ge=0, le=30)


class ClaimOut(BaseModel):
    actions: list[ActionView]


class CompleteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operator_id: str = Field(pattern=OPERATOR_ID_PATTERN)
    status: Literal["done", "failed"]
    message: str = Field(default="", max_length=4096)
    result: dict[str, Any] | None = None


class ExtendIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operator_id: str = Field(pattern=OPERATOR_ID_PATTERN)
    lease_seconds: Whole = Field(default=60, ge=5, le=3600)


class ActionPage(BaseModel):
    items: list[ActionView]
    next_cursor: str | None


class OptOutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=1024)
    author: str = Field(default="", max_length=253)


class OptOutView(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    scope: Literal["node", "job"]
    name: str
    reason: str
    author: str
    created_at: datetime
