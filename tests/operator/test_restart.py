"""Restart by pod deletion against kmock: exactly the job's pods go, budgets are respected."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client import V1Job, V1Pod

from diagnoser.operator.cluster import Cluster
from diagnoser.operator.restart import RestartSettings, restart
from diagnoser.operator.wire import ActionKind, CompletionStatus, RestartTarget, WorkloadKind
from tests.operator.conftest import T0, Emulator, action, model

PODS = "v1/pods"
BEFORE = T0 - timedelta(hours=1)
SETTINGS = RestartSettings()


def make_pod(
    cluster: Cluster,
    name: str,
    labels: dict[str, str],
    *,
    namespace: str = "ml",
    owner: tuple[str, str, str] | None = None,
    created: Any = BEFORE,
    phase: str = "Running",
    restarts: int = 0,
) -> None:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "creationTimestamp": created.isoformat(),
    }
    if owner is not None:
        kind, owner_name, uid = owner
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": kind, "name": owner_name, "uid": uid, "controller": True}
        ]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "trainer:1",
                    "imageID": "",
                    "ready": True,
                    "restartCount": restarts,
                }
            ],
        },
    }
    cluster.core.create_namespaced_pod(namespace, model(V1Pod, body))


def make_custom(cluster: Cluster, group: str, version: str, plural: str, body: Any) -> None:
    cluster.custom.create_namespaced_custom_object(group, version, "ml", plural, body)


def run(cluster: Cluster, kind: WorkloadKind | None, name: str | None, **kwargs: Any) -> Any:
    target = {"namespace": "ml", "workload_kind": kind, "name": name, "resume_from_step": 1200}
    act = action(40, ActionKind.RESTART_JOB, target)
    settings = kwargs.pop("settings", SETTINGS)
    return restart(cluster, act, RestartTarget.model_validate(target), settings=settings, **kwargs)


def pytorchjob(backoff_limit: int | None = 3, conditions: list[Any] | None = None) -> Any:
    run_policy = {} if backoff_limit is None else {"backoffLimit": backoff_limit}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train-42", "namespace": "ml", "uid": "uid-pt"},
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": {}},
        "status": {"conditions": conditions or []},
    }


def pytorch_pods(cluster: Cluster, restarts: int = 0) -> None:
    label = {"training.kubeflow.org/job-name": "train-42"}
    for rank in range(2):
        make_pod(
            cluster,
            f"train-42-worker-{rank}",
            label,
            owner=("PyTorchJob", "train-42", "uid-pt"),
            restarts=restarts,
        )
    # Same label, another owner (a previous incarnation): not this job's pod.
    make_pod(cluster, "train-42-stale", label, owner=("PyTorchJob", "train-42", "uid-old"))
    make_pod(cluster, "other-0", {"training.kubeflow.org/job-name": "other"})


def test_pytorchjob_restart_deletes_exactly_its_pods(cluster: Cluster, emulator: Emulator) -> None:
    make_custom(cluster, "kubeflow.org", "v1", "pytorchjobs", pytorchjob())
    pytorch_pods(cluster)
    outcome = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    assert outcome.status is CompletionStatus.DONE, outcome.message
    assert outcome.result["deleted"] == ["ml/train-42-worker-0", "ml/train-42-worker-1"]
    assert outcome.result["resume_from_step"] == 1200
    assert emulator.names(PODS, "ml") == ["other-0", "train-42-stale"]


def test_replayed_restart_spares_the_recreated_pods(cluster: Cluster, emulator: Emulator) -> None:
    make_custom(cluster, "kubeflow.org", "v1", "pytorchjobs", pytorchjob())
    pytorch_pods(cluster)
    run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    # The controller recreates the ranks after the action was created.
    label = {"training.kubeflow.org/job-name": "train-42"}
    for rank in range(2):
        make_pod(
            cluster,
            f"train-42-worker-{rank}",
            label,
            owner=("PyTorchJob", "train-42", "uid-pt"),
            created=T0 + timedelta(minutes=2),
        )
    replay = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    assert replay.status is CompletionStatus.DONE
    assert replay.result["deleted"] == []
    assert "train-42-worker-0" in emulator.names(PODS, "ml")


def test_pytorchjob_with_exhausted_backoff_limit_is_not_touched(
    cluster: Cluster, emulator: Emulator
) -> None:
    make_custom(cluster, "kubeflow.org", "v1", "pytorchjobs", pytorchjob(backoff_limit=3))
    pytorch_pods(cluster, restarts=2)  # 2 ranks x 2 container restarts = 4 >= 3
    outcome = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    assert outcome.status is CompletionStatus.FAILED
    assert "restart budget exhausted (backoff_limit 3, restarts 4)" in outcome.message
    assert len(emulator.names(PODS, "ml")) == 4


def test_failed_pytorchjob_is_reported_not_restarted(cluster: Cluster, emulator: Emulator) -> None:
    failed = [{"type": "Failed", "status": "True"}]
    make_custom(cluster, "kubeflow.org", "v1", "pytorchjobs", pytorchjob(conditions=failed))
    pytorch_pods(cluster)
    outcome = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    assert outcome.status is CompletionStatus.FAILED
    assert outcome.message.startswith("PyTorchJob ml/train-42 is Failed")
    assert len(emulator.names(PODS, "ml")) == 4


def jobset(max_restarts: int | None, restarts: int, counted: int | None = None) -> Any:
    spec: dict[str, Any] = {"replicatedJobs": []}
    if max_restarts is not None:
        spec["failurePolicy"] = {"maxRestarts": max_restarts}
    status: dict[str, Any] = {"restarts": restarts}
    if counted is not None:
        status["restartsCountTowardsMax"] = counted
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train-42", "namespace": "ml"},
        "spec": spec,
        "status": status,
    }


def jobset_pods(cluster: Cluster) -> None:
    label = {"jobset.sigs.k8s.io/jobset-name": "train-42"}
    make_pod(cluster, "train-42-workers-0-0", label, owner=("Job", "train-42-workers-0", "j0"))
    make_pod(cluster, "train-42-workers-0-1", label, owner=("Job", "train-42-workers-0", "j0"))
    make_pod(cluster, "train-42-done", label, phase="Succeeded")
    make_pod(cluster, "unrelated", {"app": "x"})


def test_jobset_restart_within_budget(cluster: Cluster, emulator: Emulator) -> None:
    make_custom(cluster, "jobset.x-k8s.io", "v1alpha2", "jobsets", jobset(3, restarts=5, counted=1))
    jobset_pods(cluster)
    outcome = run(cluster, WorkloadKind.JOB_SET, "train-42")
    assert outcome.status is CompletionStatus.DONE, outcome.message
    assert outcome.result["budget"] == {"max_restarts": 3, "restarts": 1}
    assert emulator.names(PODS, "ml") == ["train-42-done", "unrelated"]


@pytest.mark.parametrize(
    ("max_restarts", "restarts"),
    [(None, 0), (2, 2)],
    ids=["no-failure-policy", "max-restarts-reached"],
)
def test_jobset_without_budget_is_not_restarted(
    cluster: Cluster, emulator: Emulator, max_restarts: int | None, restarts: int
) -> None:
    body = jobset(max_restarts, restarts=restarts)
    make_custom(cluster, "jobset.x-k8s.io", "v1alpha2", "jobsets", body)
    jobset_pods(cluster)
    outcome = run(cluster, WorkloadKind.JOB_SET, "train-42")
    assert outcome.status is CompletionStatus.FAILED
    assert "restart budget exhausted" in outcome.message
    assert len(emulator.names(PODS, "ml")) == 4


def batch_job(backoff_limit: int, failed: int) -> Any:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train-42", "namespace": "ml", "uid": "uid-job"},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": {"batch.kubernetes.io/job-name": "train-42"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "trainer:1"}],
                },
            },
        },
        "status": {"failed": failed},
    }


def job_pods(cluster: Cluster) -> None:
    label = {"batch.kubernetes.io/job-name": "train-42"}
    for index in range(2):
        make_pod(cluster, f"train-42-{index}", label, owner=("Job", "train-42", "uid-job"))


@pytest.mark.parametrize(
    ("backoff_limit", "failed", "restarted"),
    [(6, 4, True), (6, 5, False)],
    ids=["two-failures-left", "one-failure-left"],
)
def test_batch_job_counts_each_deleted_pod_as_a_failure(
    cluster: Cluster, emulator: Emulator, backoff_limit: int, failed: int, restarted: bool
) -> None:
    cluster.batch.create_namespaced_job("ml", model(V1Job, batch_job(backoff_limit, failed)))
    job_pods(cluster)
    outcome = run(cluster, WorkloadKind.JOB, "train-42")
    left = emulator.names(PODS, "ml")
    if restarted:
        assert outcome.status is CompletionStatus.DONE, outcome.message
        assert outcome.result["deleted"] == ["ml/train-42-0", "ml/train-42-1"]
        assert left == []
    else:
        assert outcome.status is CompletionStatus.FAILED
        assert "backoff_limit 6, failed 5" in outcome.message
        assert left == ["train-42-0", "train-42-1"]


def test_bare_pods_are_selected_by_the_job_label(cluster: Cluster, emulator: Emulator) -> None:
    make_pod(cluster, "rank-0", {"diagnoser.io/job": "train-42"})
    make_pod(cluster, "rank-1", {"diagnoser.io/job": "train-42"}, namespace="other")
    make_pod(cluster, "rank-x", {"diagnoser.io/job": "train-43"})
    target = {"namespace": None, "workload_kind": None, "name": None}
    act = action(41, ActionKind.RESTART_JOB, target)
    outcome = restart(cluster, act, RestartTarget.model_validate(target), settings=SETTINGS)
    assert outcome.status is CompletionStatus.DONE
    assert outcome.result["deleted"] == ["ml/rank-0", "other/rank-1"]
    assert emulator.names(PODS) == ["rank-x"]


def test_missing_workload_fails_with_the_reason(cluster: Cluster) -> None:
    outcome = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42")
    assert outcome.status is CompletionStatus.FAILED
    assert outcome.message == "PyTorchJob ml/train-42 not found"


def test_disabled_kind_and_dry_run(cluster: Cluster, emulator: Emulator) -> None:
    make_custom(cluster, "kubeflow.org", "v1", "pytorchjobs", pytorchjob())
    pytorch_pods(cluster)
    only_jobs = RestartSettings(workload_kinds=frozenset({WorkloadKind.JOB}))
    disabled = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42", settings=only_jobs)
    assert disabled.status is CompletionStatus.FAILED
    dry = run(cluster, WorkloadKind.PYTORCH_JOB, "train-42", dry_run=True)
    assert dry.result["would_delete"] == ["ml/train-42-worker-0", "ml/train-42-worker-1"]
    assert len(emulator.names(PODS, "ml")) == 4
