"""verify_nodes: the two-round all-gather check that tells a bad node from a bad pairing.

Round 1 pairs the suspect nodes (three in the last group when their count is odd) and runs one
all-gather test Job per group, pinned to exactly its nodes. Round 2 pairs each node of a failing
group with a known-good node (schedulable, untainted, Ready, not a suspect). A node is reported
in `failed_nodes` only when it fails both rounds; the service turns those into cordons.

Idempotent on redelivery: Job names derive from the action id, round and group, so a redelivered
action finds the Jobs it already created (409 on create) and waits for their outcome instead of
starting new ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import V1Job
from kubernetes.client.exceptions import ApiException

from diagnoser.operator.cluster import Cluster, is_conflict, is_not_found
from diagnoser.operator.outcome import Outcome
from diagnoser.operator.wire import ActionView, VerifyTarget

LABEL_ACTION = "diagnoser.io/action-id"
LABEL_ROUND = "diagnoser.io/verify-round"
LABEL_JOB = "diagnoser.io/verify-job"

DEFAULT_IMAGE = "nccl-tests:latest"
"""A local name: build an image with NVIDIA's nccl-tests and set it with --verify-image."""
DEFAULT_COMMAND = ("all_gather_perf", "--minbytes", "8M", "--maxbytes", "1G", "--stepfactor", "2")


class VerificationAbortedError(Exception):
    """The operator is stopping: leave the Jobs, a redelivery resumes waiting for them."""


@dataclass(frozen=True)
class VerifySettings:
    image: str = DEFAULT_IMAGE
    command: tuple[str, ...] = DEFAULT_COMMAND
    namespace: str = "diagnoser"
    """Where test Jobs run when the action names no namespace."""
    gpus_per_node: int = 8
    """`nvidia.com/gpu` each test pod requests (0: none, e.g. in a test cluster)."""
    taint_key: str = "diagnoser.io/faulty"
    """Test pods tolerate this taint and cordons, so that cordoned suspects can be re-checked;
    nodes carrying it are never known-good."""
    timeout_seconds: float = 900.0
    poll_seconds: float = 5.0
    keep_jobs: bool = False
    """Leave finished test Jobs for inspection (they expire after one hour either way)."""
    extra_env: dict[str, str] = field(default_factory=dict)


def pair(nodes: Sequence[str]) -> list[list[str]]:
    """Pairs in order; an odd count makes the last group three. One node is a group of one."""
    ordered = list(dict.fromkeys(nodes))
    if len(ordered) < 2:
        return [ordered] if ordered else []
    groups = [ordered[i : i + 2] for i in range(0, len(ordered) - len(ordered) % 2, 2)]
    if len(ordered) % 2:
        groups[-1].append(ordered[-1])
    return groups


def job_name(action: ActionView, round_number: int, index: int) -> str:
    return f"diagnoser-verify-{action.id}-r{round_number}-g{index}"


def all_gather_job(
    action: ActionView,
    round_number: int,
    index: int,
    nodes: Sequence[str],
    namespace: str,
    settings: VerifySettings,
) -> dict[str, Any]:
    """One Indexed Job with a pod per node: nodeAffinity pins the set, anti-affinity spreads it."""
    name = job_name(action, round_number, index)
    labels = {LABEL_ACTION: str(action.id), LABEL_ROUND: str(round_number), LABEL_JOB: name}
    env = {
        "DIAGNOSER_VERIFY_NODES": ",".join(nodes),
        "DIAGNOSER_VERIFY_ROUND": str(round_number),
        **settings.extra_env,
    }
    resources: dict[str, Any] = {}
    if settings.gpus_per_node:
        resources = {"limits": {"nvidia.com/gpu": str(settings.gpus_per_node)}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "completions": len(nodes),
            "parallelism": len(nodes),
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(settings.timeout_seconds),
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": list(nodes),
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {LABEL_JOB: name}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        },
                    },
                    # Pinned to its nodes, the test tolerates what keeps other pods off them
                    # (a cordon, a dedicated-GPU taint), as a DaemonSet would; not NoExecute.
                    "tolerations": [
                        {"key": settings.taint_key, "operator": "Exists"},
                        {"operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [
                        {
                            "name": "all-gather",
                            "image": settings.image,
                            "command": list(settings.command),
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                            "resources": resources,
                        }
                    ],
                },
            },
        },
    }


def job_outcome(job: dict[str, Any]) -> str | None:
    """passed, failed, or None while running (backoffLimit 0: one failed pod fails the group)."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Failed":
            return "failed"
        if condition.get("type") == "Complete":
            return "passed"
    if int(status.get("failed") or 0) > 0:
        return "failed"
    completions = int((job.get("spec") or {}).get("completions") or 1)
    if int(status.get("succeeded") or 0) >= completions:
        return "passed"
    return None


def _disqualifying(taint: dict[str, Any], taint_key: str) -> bool:
    """Our own cordon taint, the node lifecycle taints (not-ready, unreachable, pressure), and any
    NoExecute taint. Other NoSchedule taints (a dedicated-GPU taint) are tolerated by the test."""
    key = str(taint.get("key") or "")
    return (
        key == taint_key
        or key.startswith("node.kubernetes.io/")
        or (taint.get("effect") == "NoExecute")
    )


def known_good(cluster: Cluster, suspects: Sequence[str], taint_key: str) -> list[str]:
    """Schedulable, Ready nodes outside the suspect set with no disqualifying taint."""
    excluded = set(suspects)
    good: list[str] = []
    for node in cluster.plain(cluster.core.list_node()).get("items") or []:
        name = node.get("metadata", {}).get("name")
        spec, status = node.get("spec") or {}, node.get("status") or {}
        if not name or name in excluded or spec.get("unschedulable"):
            continue
        if any(_disqualifying(taint, taint_key) for taint in spec.get("taints") or []):
            continue
        conditions = status.get("conditions")
        if conditions is not None and not any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        ):
            continue
        good.append(name)
    return sorted(good)


def verify(
    cluster: Cluster,
    action: ActionView,
    target: VerifyTarget,
    *,
    settings: VerifySettings,
    stop: threading.Event,
    dry_run: bool = False,
) -> Outcome:
    namespace = target.namespace or settings.namespace
    suspects = list(dict.fromkeys(target.nodes))
    if not suspects:
        return Outcome.done("no node to verify", failed_nodes=[], rounds=[])
    first = pair(suspects)
    if dry_run:
        return Outcome.done(
            f"dry run: would run {len(first)} all-gather test Jobs in round 1",
            dry_run=True,
            groups=first,
            namespace=namespace,
        )
    rounds: list[dict[str, Any]] = []
    results = _run_round(cluster, action, 1, first, namespace, settings, stop)
    rounds.append({"round": 1, "groups": results})
    failing = [node for group in results if group["outcome"] == "failed" for node in group["nodes"]]
    if not failing:
        return Outcome.done(
            f"all {len(suspects)} nodes passed round 1", failed_nodes=[], rounds=rounds
        )
    good = known_good(cluster, suspects, settings.taint_key)
    if not good:
        return Outcome.failed(
            "round 1 failed for "
            + ", ".join(failing)
            + " but no known-good node is free for round 2: nothing reported",
            failed_nodes=[],
            rounds=rounds,
        )
    # A known-good node serves in one test at a time: waves of at most len(good) pairs.
    second: list[dict[str, Any]] = []
    for start in range(0, len(failing), len(good)):
        wave = failing[start : start + len(good)]
        groups = [[node, good[i]] for i, node in enumerate(wave)]
        second += _run_round(cluster, action, 2, groups, namespace, settings, stop, start)
    rounds.append({"round": 2, "groups": second})
    failed_nodes = [group["nodes"][0] for group in second if group["outcome"] == "failed"]
    return Outcome.done(
        f"{len(failed_nodes)} of {len(suspects)} nodes failed both rounds"
        + (": " + ", ".join(failed_nodes) if failed_nodes else ""),
        failed_nodes=failed_nodes,
        rounds=rounds,
    )


def _run_round(
    cluster: Cluster,
    action: ActionView,
    round_number: int,
    groups: list[list[str]],
    namespace: str,
    settings: VerifySettings,
    stop: threading.Event,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    names = []
    for offset, nodes in enumerate(groups):
        body = all_gather_job(
            action, round_number, first_index + offset, nodes, namespace, settings
        )
        job = V1Job.from_dict(body)
        if job is None:
            raise TypeError("the test Job body did not build")
        try:
            cluster.batch.create_namespaced_job(namespace, job)
        except ApiException as exc:
            if not is_conflict(exc):  # 409: created by an earlier delivery of this action
                raise
        names.append(body["metadata"]["name"])

    outcomes: dict[str, str] = {}
    deadline = time.monotonic() + settings.timeout_seconds
    while True:
        for name in names:
            if name not in outcomes:
                job_json = cluster.plain(cluster.batch.read_namespaced_job(name, namespace))
                found = job_outcome(job_json)
                if found is not None:
                    outcomes[name] = found
        if len(outcomes) == len(names):
            break
        if time.monotonic() > deadline:
            pending = [name for name in names if name not in outcomes]
            raise TimeoutError(
                f"round {round_number}: no outcome after {settings.timeout_seconds:.0f}s "
                f"for {', '.join(pending)}"
            )
        if stop.wait(settings.poll_seconds):
            raise VerificationAbortedError(f"stopped while waiting for round {round_number}")

    if not settings.keep_jobs:
        for name in names:
            try:
                cluster.batch.delete_namespaced_job(
                    name, namespace, propagation_policy="Background"
                )
            except ApiException as exc:
                if not is_not_found(exc):
                    raise
    return [
        {"nodes": nodes, "job": name, "outcome": outcomes[name]}
        for nodes, name in zip(groups, names, strict=True)
    ]
