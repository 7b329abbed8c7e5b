"""A diagnosis becomes an ordered plan of actions (pure: facts in, planned actions out).

`cordon_node_and_restart`: one `cordon_node` per culprit, then one `restart_job` that depends
on them. With no culprit but an interconnect suspicion (NCCL, NVLink, InfiniBand), a
`verify_nodes` over the job's nodes comes first: the nodes it finds bad become cordons, and
the restart waits for them. `notify_user` and `escalate` tell people (`notify`, audience
`user` or `oncall`). Whether each action may run is the policy's call, not the plan's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnoser.actions.kinds import (
    MAX_EVIDENCE_LINES,
    TAINT_KEY,
    ActionKind,
    Audience,
    CordonTarget,
    NotifyTarget,
    RestartTarget,
    UncordonTarget,
    VerifyTarget,
)

WORKLOAD_KINDS = frozenset({"PyTorchJob", "JobSet", "Job", "Pod"})
MAX_REASON = 1000


@dataclass(frozen=True, slots=True)
class DiagnosisFacts:
    """What planning needs to know of a diagnosis and its job (read by the store)."""

    id: str
    job_id: str
    action: str
    failure_type: str | None = None
    category: str | None = None
    summary: str = ""
    culprit_nodes: tuple[str, ...] = ()
    source: str = "rule"
    confidence: float = 1.0
    rule_ids: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    """Evidence lines, already redacted."""
    job_nodes: tuple[str, ...] = ()
    namespace: str | None = None
    family: str | None = None
    workload_kind: str | None = None
    workload_name: str | None = None
    checkpoint_step: int | None = None
    diagnosis_url: str | None = None


@dataclass(frozen=True, slots=True)
class PlannedAction:
    key: str
    """The idempotency key: the same diagnosis planning the same action twice is one action."""
    kind: ActionKind
    job_id: str
    diagnosis_id: str
    target: dict[str, Any]
    reason: str
    source: str
    node: str | None = None
    nodes: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()
    """Keys of actions of the same plan that must be `done` first."""
    confidence: float = 1.0
    escalation: str | None = None
    """Set on on-call notifications the policy raises itself: `blast_radius`, `restart_budget`."""


def source_of(diagnosis_source: str) -> str:
    """The contract's `source`: rules and correlation are both `rules`."""
    return {"rule": "rules", "correlation": "rules"}.get(diagnosis_source, diagnosis_source)


def _why(facts: DiagnosisFacts) -> str:
    rules = f" (rule {', '.join(facts.rule_ids)})" if facts.rule_ids else ""
    return f"{facts.failure_type or 'unknown failure'}{rules}: {facts.summary}"[:MAX_REASON]


def cordon(facts: DiagnosisFacts, node: str, why: str | None = None) -> PlannedAction:
    target = CordonTarget(
        node=node,
        failure_type=facts.failure_type,
        taint_key=TAINT_KEY,
        taint_value=facts.failure_type or "unknown",
    )
    return PlannedAction(
        key=f"cordon_node:{node}:{facts.id}",
        kind=ActionKind.CORDON_NODE,
        job_id=facts.job_id,
        diagnosis_id=facts.id,
        target=target.model_dump(mode="json"),
        reason=(why or f"{facts.failure_type or 'failure'} on {node}: {_why(facts)}")[:MAX_REASON],
        source=source_of(facts.source),
        node=node,
        nodes=(node,),
        confidence=facts.confidence,
    )


def restart(facts: DiagnosisFacts, after: Sequence[str] = ()) -> PlannedAction:
    kind = facts.workload_kind if facts.workload_kind in WORKLOAD_KINDS else None
    target = RestartTarget(
        namespace=facts.namespace,
        workload_kind=kind,
        name=facts.workload_name,
        resume_from_step=facts.checkpoint_step,
    )
    return PlannedAction(
        key=f"restart_job:{facts.job_id}:{facts.id}",
        kind=ActionKind.RESTART_JOB,
        job_id=facts.job_id,
        diagnosis_id=facts.id,
        target=target.model_dump(mode="json"),
        reason=f"restart {facts.job_id}: {_why(facts)}"[:MAX_REASON],
        source=source_of(facts.source),
        depends_on=tuple(after),
        confidence=facts.confidence,
    )


def notify(
    facts: DiagnosisFacts,
    audience: Audience,
    message: str,
    key: str | None = None,
    escalation: str | None = None,
) -> PlannedAction:
    target = NotifyTarget(
        audience=audience,
        message=message[:MAX_REASON],
        diagnosis_url=facts.diagnosis_url,
        summary=facts.summary,
        category=facts.category,
        failure_type=facts.failure_type,
        culprit_nodes=list(facts.culprit_nodes),
        evidence=list(facts.evidence[:MAX_EVIDENCE_LINES]),
        family=facts.family,
        namespace=facts.namespace,
        action=facts.action,
        resume_from_step=facts.checkpoint_step,
    )
    return PlannedAction(
        key=key or f"notify:{audience.value}:{facts.id}",
        kind=ActionKind.NOTIFY,
        job_id=facts.job_id,
        diagnosis_id=facts.id,
        target=target.model_dump(mode="json"),
        reason=message[:MAX_REASON],
        source="policy" if escalation else source_of(facts.source),
        confidence=facts.confidence,
        escalation=escalation,
    )


def verify(facts: DiagnosisFacts, namespace: str | None = None) -> PlannedAction:
    nodes = tuple(sorted(set(facts.job_nodes)))
    return PlannedAction(
        key=f"verify_nodes:{facts.job_id}:{facts.id}",
        kind=ActionKind.VERIFY_NODES,
        job_id=facts.job_id,
        diagnosis_id=facts.id,
        target=VerifyTarget(nodes=list(nodes), namespace=namespace).model_dump(mode="json"),
        reason=f"no culprit node for {_why(facts)}: check the job's nodes pairwise"[:MAX_REASON],
        source=source_of(facts.source),
        nodes=nodes,
        confidence=facts.confidence,
    )


def uncordon(facts: DiagnosisFacts, node: str, undo_of: int, why: str) -> PlannedAction:
    return PlannedAction(
        key=f"uncordon_node:{node}:{undo_of}",
        kind=ActionKind.UNCORDON_NODE,
        job_id=facts.job_id,
        diagnosis_id=facts.id,
        target=UncordonTarget(node=node, undo_of=undo_of).model_dump(mode="json"),
        reason=why[:MAX_REASON],
        source="human",
        node=node,
        nodes=(node,),
    )


def plan(facts: DiagnosisFacts, verify_failure_types: Sequence[str] = ()) -> list[PlannedAction]:
    """The ordered plan for a diagnosis's recommended action; empty for `none`."""
    if facts.action in ("cordon_node_and_restart", "restart_job"):
        if facts.culprit_nodes and facts.action == "cordon_node_and_restart":
            cordons = [cordon(facts, node) for node in dict.fromkeys(facts.culprit_nodes)]
            return [*cordons, restart(facts, [c.key for c in cordons])]
        if (
            not facts.culprit_nodes
            and facts.failure_type in verify_failure_types
            and len(set(facts.job_nodes)) >= 2
        ):
            check = verify(facts, facts.namespace)
            return [check, restart(facts, [check.key])]
        return [restart(facts)]
    if facts.action == "notify_user":
        return [notify(facts, Audience.USER, f"{facts.job_id}: {_why(facts)}")]
    if facts.action == "escalate":
        return [notify(facts, Audience.ONCALL, f"{facts.job_id} needs a person: {_why(facts)}")]
    return []
