"""Cordon a node and undo it exactly, idempotently, with the contract's Node objects.

A cordon sets `spec.unschedulable`, adds one taint, the label `diagnoser.io/cordoned=true` and
annotations saying which action, which diagnosis, why and when. Undo removes exactly those and
leaves the node cordoned when it already was before us (`diagnoser.io/was-unschedulable`).

Every write is a JSON merge patch computed from a fresh read and carrying the read's
`resourceVersion`, so a concurrent change by a person or a controller makes the API server answer
409 and the operator re-reads instead of overwriting (taints are a list: a merge patch replaces
it whole)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from diagnoser.operator.cluster import Cluster, is_conflict
from diagnoser.operator.outcome import Outcome
from diagnoser.operator.wire import ActionView, CordonTarget, UncordonTarget

PREFIX = "diagnoser.io/"
LABEL_CORDONED = PREFIX + "cordoned"
ANNOTATION_ACTION = PREFIX + "action-id"
ANNOTATION_DIAGNOSIS = PREFIX + "diagnosis-id"
ANNOTATION_REASON = PREFIX + "reason"
ANNOTATION_CORDONED_AT = PREFIX + "cordoned-at"
ANNOTATION_WAS_UNSCHEDULABLE = PREFIX + "was-unschedulable"
ANNOTATION_UNCORDON_OBSERVED = PREFIX + "uncordon-observed-at"
ANNOTATION_TAINT = PREFIX + "taint"
"""Extension of the contract: the taint this cordon added (`key=value:effect`), absent when an
equal key and effect were already on the node, so that undo removes that taint and no other."""

OWN_ANNOTATIONS = (
    ANNOTATION_ACTION,
    ANNOTATION_DIAGNOSIS,
    ANNOTATION_REASON,
    ANNOTATION_CORDONED_AT,
    ANNOTATION_WAS_UNSCHEDULABLE,
    ANNOTATION_UNCORDON_OBSERVED,
    ANNOTATION_TAINT,
)
MAX_REASON = 512
CONFLICT_RETRIES = 5


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_taint(taint: dict[str, Any]) -> str:
    return f"{taint['key']}={taint.get('value') or ''}:{taint['effect']}"


def parse_taint(text: str) -> tuple[str, str, str] | None:
    head, sep, effect = text.rpartition(":")
    if not sep:
        return None
    key, _, value = head.partition("=")
    return key, value, effect


def _same_taint(taint: dict[str, Any], key: str, value: str, effect: str) -> bool:
    return (
        taint.get("key") == key
        and (taint.get("value") or "") == value
        and taint.get("effect") == effect
    )


def _read(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.plain(cluster.core.read_node(name))


def _patch(cluster: Cluster, name: str, node: dict[str, Any], patch: dict[str, Any]) -> None:
    version = node.get("metadata", {}).get("resourceVersion")
    if version:
        patch.setdefault("metadata", {})["resourceVersion"] = version
    cluster.core.patch_node(name, patch, _content_type="application/merge-patch+json")


def cordon(
    cluster: Cluster,
    action: ActionView,
    target: CordonTarget,
    *,
    now: datetime,
    dry_run: bool = False,
) -> Outcome:
    """Cordon `target.node` for `action`; a 409 race re-reads the node and decides again."""
    for _ in range(CONFLICT_RETRIES):
        node = _read(cluster, target.node)
        decision = plan_cordon(node, action, target, now=now)
        if decision.patch is None:
            return decision.outcome
        if dry_run:
            return Outcome.done(
                f"dry run: would patch node {target.node}",
                dry_run=True,
                node=target.node,
                patch=decision.patch,
            )
        try:
            _patch(cluster, target.node, node, decision.patch)
        except ApiException as exc:
            if is_conflict(exc):
                continue
            raise
        return decision.outcome
    raise ApiException(status=409, reason=f"node {target.node} kept changing while cordoning")


@dataclass(frozen=True)
class Plan:
    """One decision about a node: the merge patch to send (None: nothing) and the completion."""

    patch: dict[str, Any] | None
    outcome: Outcome


def plan_cordon(
    node: dict[str, Any], action: ActionView, target: CordonTarget, *, now: datetime
) -> Plan:
    """Pure: what cordoning `node` for `action` means, given what the node carries now."""
    meta = node.get("metadata", {})
    annotations: dict[str, str] = meta.get("annotations") or {}
    spec = node.get("spec", {})
    unschedulable = bool(spec.get("unschedulable"))
    ours = ANNOTATION_CORDONED_AT in annotations

    if ours and not unschedulable:
        # Cordoned by us, schedulable again: a person uncordoned it since.
        observed_text = annotations.get(ANNOTATION_UNCORDON_OBSERVED)
        observed = parse_rfc3339(observed_text) if observed_text else None
        observed = observed or now
        if action.created_at < observed:
            stamp = rfc3339(observed)
            stamp_patch = (
                None
                if observed_text
                else {"metadata": {"annotations": {ANNOTATION_UNCORDON_OBSERVED: stamp}}}
            )
            return Plan(
                stamp_patch,
                Outcome.done(
                    f"node {target.node} was uncordoned by a human since {stamp}: not re-cordoned",
                    node=target.node,
                    skipped=f"uncordoned by a human since {stamp}",
                ),
            )
    elif annotations.get(ANNOTATION_ACTION) == str(action.id):
        return Plan(
            None,
            Outcome.done(
                f"node {target.node} already cordoned by action {action.id}",
                node=target.node,
                replayed=True,
            ),
        )

    taints: list[dict[str, Any]] = list(spec.get("taints") or [])
    if ours:
        # Replace the cordon of an earlier action (or after a human uncordon): drop its taint.
        previous = parse_taint(annotations.get(ANNOTATION_TAINT, ""))
        if previous is not None:
            taints = [t for t in taints if not _same_taint(t, *previous)]
    if ours and unschedulable:
        was_unschedulable = annotations.get(ANNOTATION_WAS_UNSCHEDULABLE, "false")
    else:
        was_unschedulable = "true" if unschedulable else "false"

    taint = {"key": target.taint_key, "value": target.taint_value, "effect": target.taint_effect}
    taint_text: str | None = format_taint(taint)
    key, effect = target.taint_key, target.taint_effect
    if any(t.get("key") == key and t.get("effect") == effect for t in taints):
        taint_text = None  # someone else's equal key and effect: leave it, add none
    else:
        taints.append(taint)

    patch: dict[str, Any] = {
        "metadata": {
            "labels": {LABEL_CORDONED: "true"},
            "annotations": {
                ANNOTATION_ACTION: str(action.id),
                ANNOTATION_DIAGNOSIS: action.diagnosis_id,
                ANNOTATION_REASON: action.reason[:MAX_REASON],
                ANNOTATION_CORDONED_AT: rfc3339(now),
                ANNOTATION_WAS_UNSCHEDULABLE: was_unschedulable,
                ANNOTATION_TAINT: taint_text,
                ANNOTATION_UNCORDON_OBSERVED: None,
            },
        },
        "spec": {"unschedulable": True, "taints": taints},
    }
    return Plan(
        patch,
        Outcome.done(
            f"cordoned node {target.node}",
            node=target.node,
            taint=taint_text,
            was_unschedulable=was_unschedulable == "true",
        ),
    )


def uncordon(
    cluster: Cluster,
    action: ActionView,
    target: UncordonTarget,
    *,
    dry_run: bool = False,
) -> Outcome:
    """Undo the cordon of action `target.undo_of`, and nothing else."""
    for _ in range(CONFLICT_RETRIES):
        node = _read(cluster, target.node)
        decision = plan_uncordon(node, target)
        if decision.patch is None:
            return decision.outcome
        if dry_run:
            return Outcome.done(
                f"dry run: would patch node {target.node}",
                dry_run=True,
                node=target.node,
                patch=decision.patch,
            )
        try:
            _patch(cluster, target.node, node, decision.patch)
        except ApiException as exc:
            if is_conflict(exc):
                continue
            raise
        return decision.outcome
    raise ApiException(status=409, reason=f"node {target.node} kept changing while uncordoning")


def plan_uncordon(node: dict[str, Any], target: UncordonTarget) -> Plan:
    meta = node.get("metadata", {})
    annotations: dict[str, str] = meta.get("annotations") or {}
    holder = annotations.get(ANNOTATION_ACTION)
    if holder != str(target.undo_of):
        why = f"carries the cordon of action {holder}" if holder else "carries no diagnoser cordon"
        return Plan(
            None,
            Outcome.done(
                f"node {target.node} {why}: nothing of action {target.undo_of} to undo",
                node=target.node,
                skipped=why,
            ),
        )
    spec = node.get("spec", {})
    patch: dict[str, Any] = {
        "metadata": {
            "labels": {LABEL_CORDONED: None},
            "annotations": dict.fromkeys(OWN_ANNOTATIONS),
        },
    }
    spec_patch: dict[str, Any] = {}
    added = parse_taint(annotations.get(ANNOTATION_TAINT, ""))
    taints: list[dict[str, Any]] = list(spec.get("taints") or [])
    if added is not None and any(_same_taint(t, *added) for t in taints):
        spec_patch["taints"] = [t for t in taints if not _same_taint(t, *added)]
    if annotations.get(ANNOTATION_WAS_UNSCHEDULABLE) != "true" and spec.get("unschedulable"):
        spec_patch["unschedulable"] = None
    if spec_patch:
        patch["spec"] = spec_patch
    return Plan(
        patch,
        Outcome.done(
            f"undid the cordon of action {target.undo_of} on node {target.node}",
            node=target.node,
            left_cordoned=annotations.get(ANNOTATION_WAS_UNSCHEDULABLE) == "true",
        ),
    )
