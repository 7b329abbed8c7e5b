"""Restart a training job by deleting its pods, so that its controller recreates them.

Deleting pods (not the workload) keeps the controller in charge: it recreates the pods, and the
scheduler places them away from cordoned nodes. Each workload kind spends its own restart budget
on that, so the operator reads the budget first and fails the action with the reason when a
restart would exhaust it (the controller would then mark the job failed instead of restarting).

Idempotent on redelivery: only pods created before the action are deleted. Once the controller has
recreated them, a replay of the same action finds nothing older and deletes nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from diagnoser.operator.cluster import Cluster, is_not_found
from diagnoser.operator.cordon import parse_rfc3339
from diagnoser.operator.outcome import Outcome
from diagnoser.operator.wire import ActionView, RestartTarget, WorkloadKind

PYTORCHJOB_LABEL = "training.kubeflow.org/job-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_LABELS = ("batch.kubernetes.io/job-name", "job-name")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_JOB_BACKOFF_LIMIT = 6
"""What the API server defaults `spec.backoffLimit` of a batch Job to."""


@dataclass(frozen=True)
class RestartSettings:
    bare_pod_label: str = "diagnoser.io/job"
    """Pods of a job with no known workload carry this label with the job id as value."""
    workload_kinds: frozenset[WorkloadKind] = field(default_factory=lambda: frozenset(WorkloadKind))
    """The kinds this operator may restart; others fail the action (configurable per cluster)."""
    grace_period_seconds: int | None = None
    """None: each pod's own terminationGracePeriodSeconds (time to write a checkpoint)."""


@dataclass(frozen=True)
class Workload:
    """The job's pods as its controller labels them, and what a restart costs it."""

    description: str
    namespace: str | None
    selector: dict[str, str]
    owner_uid: str | None
    terminal: str | None
    budget_left: int | None
    budget: dict[str, Any]


def restart(
    cluster: Cluster,
    action: ActionView,
    target: RestartTarget,
    *,
    settings: RestartSettings,
    dry_run: bool = False,
) -> Outcome:
    kind = target.workload_kind if target.name else None
    if kind is not None and kind not in settings.workload_kinds:
        return Outcome.failed(f"restarting a {kind} is disabled on this operator")
    if kind is None and WorkloadKind.POD not in settings.workload_kinds:
        return Outcome.failed("restarting bare pods is disabled on this operator")
    try:
        workload = _workload(cluster, action, target, kind, settings)
    except ApiException as exc:
        if is_not_found(exc):
            return Outcome.failed(f"{kind} {target.namespace}/{target.name} not found")
        raise
    if workload.terminal:
        return Outcome.failed(
            f"{workload.description} is {workload.terminal}: its controller recreates no pods",
            budget=workload.budget,
        )

    pods = _pods(cluster, workload)
    older = [pod for pod in pods if _created_before(pod, action.created_at)]
    victims = [
        pod
        for pod in older
        if not pod["metadata"].get("deletionTimestamp")
        and pod.get("status", {}).get("phase") not in TERMINAL_PHASES
    ]
    result: dict[str, Any] = {
        "workload": workload.description,
        "resume_from_step": target.resume_from_step,
        "budget": workload.budget,
    }
    if not victims:
        return Outcome.done(
            f"{workload.description}: no running pod older than the action; already restarted",
            deleted=[],
            **result,
        )
    cost = len(victims) if kind is WorkloadKind.JOB else 1
    if workload.budget_left is not None and cost > workload.budget_left:
        return Outcome.failed(
            f"{workload.description}: restart budget exhausted ({_budget_text(workload.budget)}); "
            "not deleting pods, the controller would fail the job",
            **result,
        )
    names = [f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}" for pod in victims]
    if dry_run:
        return Outcome.done(
            f"dry run: would delete {len(names)} pods of {workload.description}",
            dry_run=True,
            would_delete=names,
            **result,
        )
    for pod in victims:
        meta = pod["metadata"]
        try:
            cluster.core.delete_namespaced_pod(
                meta["name"],
                meta.get("namespace") or workload.namespace or "default",
                grace_period_seconds=settings.grace_period_seconds,
            )
        except ApiException as exc:
            if not is_not_found(exc):  # already gone is what we wanted
                raise
    return Outcome.done(
        f"deleted {len(names)} pods of {workload.description} for its controller to recreate",
        deleted=names,
        **result,
    )


def _workload(
    cluster: Cluster,
    action: ActionView,
    target: RestartTarget,
    kind: WorkloadKind | None,
    settings: RestartSettings,
) -> Workload:
    namespace, name = target.namespace, target.name
    if kind is None or kind is WorkloadKind.POD or namespace is None or name is None:
        return Workload(
            description=f"pods of job {action.job_id}",
            namespace=namespace,
            selector={settings.bare_pod_label: action.job_id},
            owner_uid=None,
            terminal=None,
            budget_left=None,
            budget={},
        )
    if kind is WorkloadKind.PYTORCH_JOB:
        obj = _custom(cluster, "kubeflow.org", "v1", namespace, "pytorchjobs", name)
        return _pytorchjob(cluster, obj, namespace, name)
    if kind is WorkloadKind.JOB_SET:
        obj = _custom(cluster, "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)
        return _jobset(obj, namespace, name)
    job = cluster.plain(cluster.batch.read_namespaced_job(name, namespace))
    return _job(job, namespace, name)


def _custom(
    cluster: Cluster, group: str, version: str, namespace: str, plural: str, name: str
) -> dict[str, Any]:
    obj = cluster.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
    if not isinstance(obj, dict):
        raise TypeError(f"{plural} {namespace}/{name}: expected an object")
    return obj


def _condition(obj: Mapping[str, Any], types: Iterable[str]) -> str | None:
    wanted = set(types)
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") in wanted and condition.get("status") == "True":
            return str(condition["type"])
    return None


def _pytorchjob(cluster: Cluster, obj: dict[str, Any], namespace: str, name: str) -> Workload:
    """Kubeflow's training operator counts container restarts of the job's pods against
    `runPolicy.backoffLimit` (no limit when unset); recreated pods start from zero."""
    limit = obj.get("spec", {}).get("runPolicy", {}).get("backoffLimit")
    selector = {PYTORCHJOB_LABEL: name}
    uid = obj.get("metadata", {}).get("uid")
    pods = [p for p in _list(cluster, namespace, selector) if uid is None or _owned_by(p, uid)]
    used = sum(
        int(status.get("restartCount") or 0)
        for pod in pods
        for status in pod.get("status", {}).get("containerStatuses") or []
    )
    return Workload(
        description=f"PyTorchJob {namespace}/{name}",
        namespace=namespace,
        selector=selector,
        owner_uid=uid,
        terminal=_condition(obj, ("Succeeded", "Failed")),
        budget_left=None if limit is None else int(limit) - used,
        budget={"backoff_limit": limit, "restarts": used},
    )


def _jobset(obj: dict[str, Any], namespace: str, name: str) -> Workload:
    """A JobSet restart recreates its child Jobs. A failure that matches no rule of
    `failurePolicy.rules` takes the default action, RestartJobSet, which counts against
    `maxRestarts` (0 without a failurePolicy: the first failure fails the JobSet)."""
    policy = obj.get("spec", {}).get("failurePolicy") or {}
    limit = int(policy.get("maxRestarts") or 0)
    status = obj.get("status", {})
    counted = status.get("restartsCountTowardsMax")
    used = int(counted if counted is not None else status.get("restarts") or 0)
    terminal = status.get("terminalState") or _condition(obj, ("Completed", "Failed"))
    return Workload(
        description=f"JobSet {namespace}/{name}",
        namespace=namespace,
        selector={JOBSET_LABEL: name},
        owner_uid=None,  # pods belong to the child Jobs, the label names the JobSet
        terminal=terminal,
        budget_left=limit - used,
        budget={"max_restarts": limit, "restarts": used},
    )


def _job(job: dict[str, Any], namespace: str, name: str) -> Workload:
    """Each deleted running pod of a batch Job counts as one failure against `backoffLimit`."""
    spec, status = job.get("spec", {}), job.get("status", {})
    limit = int(spec.get("backoffLimit", DEFAULT_JOB_BACKOFF_LIMIT))
    failed = int(status.get("failed") or 0)
    labels = job.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}
    key = next((label for label in JOB_LABELS if labels.get(label) == name), JOB_LABELS[0])
    return Workload(
        description=f"Job {namespace}/{name}",
        namespace=namespace,
        selector={key: name},
        owner_uid=job.get("metadata", {}).get("uid"),
        terminal=_condition(job, ("Complete", "Failed")),
        budget_left=limit - failed,
        budget={"backoff_limit": limit, "failed": failed},
    )


def _list(
    cluster: Cluster, namespace: str | None, selector: dict[str, str]
) -> list[dict[str, Any]]:
    """List by label selector, then check the labels again here: the selector is the server's
    filter, the re-check is what makes "exactly the job's pods" independent of it."""
    text = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
    if namespace is None:
        listing = cluster.core.list_pod_for_all_namespaces(label_selector=text)
    else:
        listing = cluster.core.list_namespaced_pod(namespace, label_selector=text)
    pods = cluster.plain(listing).get("items") or []
    return [pod for pod in pods if _labelled(pod, selector)]


def _labelled(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _pods(cluster: Cluster, workload: Workload) -> list[dict[str, Any]]:
    pods = _list(cluster, workload.namespace, workload.selector)
    if workload.owner_uid is None:
        return pods
    return [pod for pod in pods if _owned_by(pod, workload.owner_uid)]


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return any(owner.get("uid") == uid for owner in owners)


def _created_before(pod: Mapping[str, Any], moment: datetime) -> bool:
    text = pod.get("metadata", {}).get("creationTimestamp")
    created = parse_rfc3339(str(text)) if text else None
    return created is None or created < moment


def _budget_text(budget: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in budget.items())
