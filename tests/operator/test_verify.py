"""verify_nodes against kmock: test Jobs are created pinned to their nodes, a scripted cluster
marks each Job succeeded or failed by the nodes it runs on, and the operator finds the bad node."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes.client import V1Node

from diagnoser.operator.cluster import Cluster
from diagnoser.operator.verify import VerificationAbortedError, VerifySettings, pair, verify
from diagnoser.operator.wire import ActionKind, CompletionStatus, VerifyTarget
from tests.operator.conftest import Emulator, action, model

JOBS = "batch/v1/jobs"
FAST = VerifySettings(poll_seconds=0.02, timeout_seconds=20, gpus_per_node=0)


@pytest.mark.parametrize(
    ("nodes", "groups"),
    [
        ([], []),
        (["a"], [["a"]]),
        (["a", "b"], [["a", "b"]]),
        (["a", "b", "c"], [["a", "b", "c"]]),
        (["a", "b", "c", "d"], [["a", "b"], ["c", "d"]]),
        (["a", "b", "c", "d", "e"], [["a", "b"], ["c", "d", "e"]]),
        (["a", "b", "a"], [["a", "b"]]),
    ],
)
def test_pairing(nodes: list[str], groups: list[list[str]]) -> None:
    assert pair(nodes) == groups


def add_node(cluster: Cluster, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    cluster.core.create_node(model(V1Node, body))


def pinned_nodes(job: dict[str, Any]) -> list[str]:
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    term = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    values: list[str] = term["matchFields"][0]["values"]
    return values


@contextmanager
def scripted_cluster(emulator: Emulator, bad: set[str]) -> Iterator[list[dict[str, Any]]]:
    """Plays the Job controller: each new test Job succeeds unless it runs on a bad node."""
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def play() -> None:
        scripted: set[str] = set()
        while not stop.wait(0.01):
            for name in emulator.names(JOBS, "diagnoser"):
                if name in scripted:
                    continue
                job = emulator.raw(JOBS, "diagnoser", name)
                seen.append(job)
                scripted.add(name)
                nodes = pinned_nodes(job)
                if bad & set(nodes):
                    status = {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}
                else:
                    status = {
                        "succeeded": len(nodes),
                        "conditions": [{"type": "Complete", "status": "True"}],
                    }
                emulator.patch(JOBS, "diagnoser", name, {"status": status})

    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        yield seen
    finally:
        stop.set()
        player.join(timeout=5)


def run_verify(
    cluster: Cluster, nodes: list[str], settings: VerifySettings = FAST, **kwargs: Any
) -> Any:
    target = {"nodes": nodes, "namespace": None}
    act = action(50, ActionKind.VERIFY_NODES, target)
    stop = kwargs.pop("stop", threading.Event())
    return verify(
        cluster, act, VerifyTarget.model_validate(target), settings=settings, stop=stop, **kwargs
    )


SUSPECTS = ["node-0", "node-1", "node-2", "node-3", "node-4"]


def suspect_cluster(cluster: Cluster) -> None:
    for name in SUSPECTS:
        add_node(cluster, name)
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    add_node(cluster, "good-0", taints=[gpu])  # a dedicated-GPU taint: the test tolerates it
    add_node(cluster, "good-1")
    add_node(cluster, "cordoned", unschedulable=True)
    faulty = {"key": "diagnoser.io/faulty", "value": "xid_79", "effect": "NoSchedule"}
    add_node(cluster, "faulty", taints=[faulty])
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    add_node(cluster, "unreachable", taints=[unreachable])


def test_two_rounds_find_the_node_that_fails_both(cluster: Cluster, emulator: Emulator) -> None:
    suspect_cluster(cluster)
    with scripted_cluster(emulator, bad={"node-3"}) as jobs:
        outcome = run_verify(cluster, SUSPECTS)
    assert outcome.status is CompletionStatus.DONE, outcome.message
    assert outcome.result["failed_nodes"] == ["node-3"]
    round1, round2 = outcome.result["rounds"]
    assert [(g["nodes"], g["outcome"]) for g in round1["groups"]] == [
        (["node-0", "node-1"], "passed"),
        (["node-2", "node-3", "node-4"], "failed"),
    ]
    # Each node of the failing group beside a known-good node; good nodes used once per wave.
    assert [(g["nodes"], g["outcome"]) for g in round2["groups"]] == [
        (["node-2", "good-0"], "passed"),
        (["node-3", "good-1"], "failed"),
        (["node-4", "good-0"], "passed"),
    ]
    by_name = {job["metadata"]["name"]: job for job in jobs}
    assert sorted(by_name) == [
        "diagnoser-verify-50-r1-g0",
        "diagnoser-verify-50-r1-g1",
        "diagnoser-verify-50-r2-g0",
        "diagnoser-verify-50-r2-g1",
        "diagnoser-verify-50-r2-g2",
    ]
    group = by_name["diagnoser-verify-50-r1-g1"]
    assert pinned_nodes(group) == ["node-2", "node-3", "node-4"]
    assert group["spec"]["completions"] == group["spec"]["parallelism"] == 3
    assert group["spec"]["backoffLimit"] == 0
    pod = group["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"][0] == "all_gather_perf"
    assert {"name": "DIAGNOSER_VERIFY_NODES", "value": "node-2,node-3,node-4"} in pod["containers"][
        0
    ]["env"]
    assert pod["tolerations"] == [
        {"key": "diagnoser.io/faulty", "operator": "Exists"},
        {"operator": "Exists", "effect": "NoSchedule"},
    ]
    assert emulator.names(JOBS) == []  # finished test Jobs are deleted


def test_all_pass_in_round_one(cluster: Cluster, emulator: Emulator) -> None:
    suspect_cluster(cluster)
    with scripted_cluster(emulator, bad=set()):
        outcome = run_verify(cluster, SUSPECTS[:4])
    assert outcome.result["failed_nodes"] == []
    assert len(outcome.result["rounds"]) == 1


def test_no_known_good_node_reports_nothing(cluster: Cluster, emulator: Emulator) -> None:
    for name in SUSPECTS[:2]:
        add_node(cluster, name)
    add_node(cluster, "cordoned", unschedulable=True)
    with scripted_cluster(emulator, bad={"node-1"}):
        outcome = run_verify(cluster, SUSPECTS[:2])
    assert outcome.status is CompletionStatus.FAILED
    assert "no known-good node" in outcome.message
    assert outcome.result["failed_nodes"] == []


def test_redelivery_reuses_the_jobs_already_created(cluster: Cluster, emulator: Emulator) -> None:
    suspect_cluster(cluster)
    keep = VerifySettings(poll_seconds=0.02, timeout_seconds=20, gpus_per_node=0, keep_jobs=True)
    with scripted_cluster(emulator, bad={"node-0"}):
        first = run_verify(cluster, SUSPECTS[:2], keep)
    versions = emulator.versions(JOBS, "diagnoser", "diagnoser-verify-50-r1-g0")
    # No controller now: only the Jobs left by the first delivery can give an outcome.
    again = run_verify(cluster, SUSPECTS[:2], keep)
    assert again.result == first.result
    assert first.result["failed_nodes"] == ["node-0"]
    assert emulator.versions(JOBS, "diagnoser", "diagnoser-verify-50-r1-g0") == versions


def test_stop_aborts_the_wait_and_leaves_the_jobs(cluster: Cluster, emulator: Emulator) -> None:
    suspect_cluster(cluster)
    stop = threading.Event()
    stop.set()
    with pytest.raises(VerificationAbortedError):
        run_verify(cluster, SUSPECTS[:2], stop=stop)
    assert emulator.names(JOBS, "diagnoser") == ["diagnoser-verify-50-r1-g0"]


def test_no_outcome_in_time_is_an_error(cluster: Cluster) -> None:
    suspect_cluster(cluster)
    quick = VerifySettings(poll_seconds=0.01, timeout_seconds=0.05, gpus_per_node=0)
    with pytest.raises(TimeoutError, match="no outcome"):
        run_verify(cluster, SUSPECTS[:2], quick)


def test_dry_run_creates_no_job(cluster: Cluster, emulator: Emulator) -> None:
    outcome = run_verify(cluster, SUSPECTS, dry_run=True)
    assert outcome.result["groups"] == [["node-0", "node-1"], ["node-2", "node-3", "node-4"]]
    assert emulator.names(JOBS) == []
