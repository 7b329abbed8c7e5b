"""Cordon and undo against the kmock emulator with the real client: the Node objects themselves."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import kmock
import pytest
from kubernetes.client import V1Node
from kubernetes.client.exceptions import ApiException

from diagnoser.operator.cluster import Cluster
from diagnoser.operator.cordon import LABEL_CORDONED, OWN_ANNOTATIONS, cordon, uncordon
from diagnoser.operator.wire import (
    ActionKind,
    CompletionStatus,
    CordonTarget,
    UncordonTarget,
)
from tests.operator.conftest import T0, Emulator, action, model

NODES = "v1/nodes"
CORDON = {
    "node": "node-3",
    "failure_type": "xid_79",
    "taint_key": "diagnoser.io/faulty",
    "taint_value": "xid_79",
    "taint_effect": "NoSchedule",
}
NOW = T0 + timedelta(minutes=1)


def make_node(cluster: Cluster, name: str = "node-3", **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "H100"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            **spec,
        },
    }
    return cluster.plain(cluster.core.create_node(model(V1Node, body)))


def do_cordon(cluster: Cluster, action_id: int = 17, **kwargs: Any) -> Any:
    act = action(action_id, ActionKind.CORDON_NODE, CORDON, created_at=kwargs.pop("created", T0))
    return cordon(
        cluster, act, CordonTarget.model_validate(CORDON), now=kwargs.pop("now", NOW), **kwargs
    )


def do_undo(cluster: Cluster, undo_of: int = 17) -> Any:
    target = {"node": "node-3", "undo_of": undo_of}
    act = action(30, ActionKind.UNCORDON_NODE, target)
    return uncordon(cluster, act, UncordonTarget.model_validate(target))


def test_cordon_writes_exactly_the_contract_fields(cluster: Cluster, emulator: Emulator) -> None:
    original = make_node(cluster)
    outcome = do_cordon(cluster)
    assert outcome.status is CompletionStatus.DONE
    node = emulator.raw(NODES, None, "node-3")
    assert node["spec"] == {
        "unschedulable": True,
        "taints": [
            *original["spec"]["taints"],
            {"key": "diagnoser.io/faulty", "value": "xid_79", "effect": "NoSchedule"},
        ],
    }
    assert node["metadata"]["labels"] == {
        **original["metadata"]["labels"],
        "diagnoser.io/cordoned": "true",
    }
    assert node["metadata"]["annotations"] == {
        **original["metadata"]["annotations"],
        "diagnoser.io/action-id": "17",
        "diagnoser.io/diagnosis-id": "3f2a9c1e-0000-4000-8000-000000000001",
        "diagnoser.io/reason": "xid 79 on node-3 (rule gpu-xid-79)",
        "diagnoser.io/cordoned-at": "2026-12-01T10:01:00Z",
        "diagnoser.io/was-unschedulable": "false",
        "diagnoser.io/taint": "diagnoser.io/faulty=xid_79:NoSchedule",
    }
    # The real client reads back what the emulator stores.
    read = cluster.core.read_node("node-3")
    assert read.spec is not None
    assert read.spec.unschedulable is True


def test_undo_restores_the_original_node_exactly(cluster: Cluster, emulator: Emulator) -> None:
    make_node(cluster)
    original = emulator.raw(NODES, None, "node-3")
    do_cordon(cluster)
    outcome = do_undo(cluster)
    assert outcome.status is CompletionStatus.DONE
    assert outcome.result["left_cordoned"] is False
    assert emulator.raw(NODES, None, "node-3") == original


def test_undo_leaves_a_node_cordoned_that_was_cordoned_before_us(
    cluster: Cluster, emulator: Emulator
) -> None:
    make_node(cluster, unschedulable=True)
    original = emulator.raw(NODES, None, "node-3")
    do_cordon(cluster)
    assert (
        emulator.raw(NODES, None, "node-3")["metadata"]["annotations"][
            "diagnoser.io/was-unschedulable"
        ]
        == "true"
    )
    outcome = do_undo(cluster)
    assert outcome.result["left_cordoned"] is True
    assert emulator.raw(NODES, None, "node-3") == original


def test_replayed_cordon_is_a_no_op(cluster: Cluster, emulator: Emulator) -> None:
    make_node(cluster)
    do_cordon(cluster)
    after_first = emulator.raw(NODES, None, "node-3")
    versions = emulator.versions(NODES, None, "node-3")
    outcome = do_cordon(cluster, now=NOW + timedelta(minutes=5))
    assert outcome.status is CompletionStatus.DONE
    assert outcome.result == {"node": "node-3", "replayed": True}
    assert emulator.versions(NODES, None, "node-3") == versions  # no write at all
    assert emulator.raw(NODES, None, "node-3") == after_first


def test_undo_of_another_action_changes_nothing(cluster: Cluster, emulator: Emulator) -> None:
    make_node(cluster)
    do_cordon(cluster)
    cordoned = emulator.raw(NODES, None, "node-3")
    outcome = do_undo(cluster, undo_of=99)
    assert outcome.status is CompletionStatus.DONE
    assert outcome.result["skipped"] == "carries the cordon of action 17"
    assert emulator.raw(NODES, None, "node-3") == cordoned


def test_human_uncordon_is_observed_and_never_reverted(
    cluster: Cluster, emulator: Emulator
) -> None:
    make_node(cluster)
    do_cordon(cluster)
    # `kubectl uncordon` removes spec.unschedulable and leaves the rest.
    emulator.patch(NODES, None, "node-3", {"spec": {"unschedulable": None}})

    seen = NOW + timedelta(minutes=10)
    stale = do_cordon(cluster, now=seen)  # the same action, redelivered after a restart
    assert stale.status is CompletionStatus.DONE
    assert stale.result["skipped"] == "uncordoned by a human since 2026-12-01T10:11:00Z"
    node = emulator.raw(NODES, None, "node-3")
    assert "unschedulable" not in node["spec"]
    assert node["metadata"]["annotations"]["diagnoser.io/uncordon-observed-at"] == (
        "2026-12-01T10:11:00Z"
    )
    # An older action for the node, claimed later still, is skipped by the same stamp.
    older = do_cordon(cluster, action_id=16, now=seen + timedelta(minutes=5))
    assert older.result["skipped"] == "uncordoned by a human since 2026-12-01T10:11:00Z"
    assert "unschedulable" not in emulator.raw(NODES, None, "node-3")["spec"]

    # A diagnosis made after the observation cordons again, with one taint, and a fresh record.
    fresh = do_cordon(cluster, action_id=18, created=seen + timedelta(minutes=1), now=seen)
    assert fresh.status is CompletionStatus.DONE
    assert "skipped" not in fresh.result
    node = emulator.raw(NODES, None, "node-3")
    assert node["spec"]["unschedulable"] is True
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", "diagnoser.io/faulty"]
    annotations = node["metadata"]["annotations"]
    assert annotations["diagnoser.io/action-id"] == "18"
    assert annotations["diagnoser.io/was-unschedulable"] == "false"
    assert "diagnoser.io/uncordon-observed-at" not in annotations


def test_dry_run_writes_nothing(cluster: Cluster, emulator: Emulator) -> None:
    make_node(cluster)
    original = emulator.raw(NODES, None, "node-3")
    outcome = do_cordon(cluster, dry_run=True)
    assert outcome.result["dry_run"] is True
    assert outcome.result["patch"]["spec"]["unschedulable"] is True
    assert emulator.raw(NODES, None, "node-3") == original


def test_missing_node_is_an_api_error(cluster: Cluster) -> None:
    with pytest.raises(ApiException) as caught:
        do_cordon(cluster)
    assert caught.value.status == 404


async def test_the_client_works_from_a_worker_thread(cluster: Cluster, emulator: Emulator) -> None:
    """The operator's own arrangement: the sync client inside asyncio.to_thread."""
    await asyncio.to_thread(make_node, cluster)
    outcome = await asyncio.to_thread(do_cordon, cluster)
    assert outcome.status is CompletionStatus.DONE
    assert emulator.raw(NODES, None, "node-3")["spec"]["unschedulable"] is True


def test_a_foreign_taint_of_the_same_key_is_left_alone(
    cluster: Cluster, emulator: Emulator
) -> None:
    manual = {"key": "diagnoser.io/faulty", "value": "manual", "effect": "NoSchedule"}
    make_node(cluster, taints=[manual])
    original = emulator.raw(NODES, None, "node-3")
    outcome = do_cordon(cluster)
    assert outcome.result["taint"] is None
    node = emulator.raw(NODES, None, "node-3")
    assert node["spec"]["taints"] == [manual]  # one taint per key and effect, not ours
    assert "diagnoser.io/taint" not in node["metadata"]["annotations"]
    do_undo(cluster)
    assert emulator.raw(NODES, None, "node-3") == original


def test_a_later_action_takes_over_the_cordon(cluster: Cluster, emulator: Emulator) -> None:
    make_node(cluster)
    original = emulator.raw(NODES, None, "node-3")
    do_cordon(cluster)
    later = {**CORDON, "failure_type": "nvlink", "taint_value": "nvlink"}
    act = action(20, ActionKind.CORDON_NODE, later)
    cordon(cluster, act, CordonTarget.model_validate(later), now=NOW + timedelta(hours=2))
    node = emulator.raw(NODES, None, "node-3")
    assert node["spec"]["taints"][1:] == [
        {"key": "diagnoser.io/faulty", "value": "nvlink", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"]["diagnoser.io/action-id"] == "20"
    assert node["metadata"]["annotations"]["diagnoser.io/was-unschedulable"] == "false"
    assert do_undo(cluster, undo_of=17).result["skipped"] == "carries the cordon of action 20"
    do_undo(cluster, undo_of=20)
    assert emulator.raw(NODES, None, "node-3") == original


def test_a_concurrent_change_is_kept_after_a_conflict(cluster: Cluster, emulator: Emulator) -> None:
    """A real API server rejects a stale patch with 409. kmock has no resourceVersion, so the
    test plays it: the first patch is undone, a person's taint lands instead, and 409 returns."""
    make_node(cluster)
    human = {"key": "maintenance", "value": "bios", "effect": "NoSchedule"}
    calls: list[int] = []

    def conflict_once(request: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return None  # no reaction: the emulator's own answer
        node = emulator.handler.objects[NODES, None, "node-3"]
        before = node.history[-2]
        assert before is not None
        node.patch(
            {
                "spec": {"unschedulable": None, "taints": [*before["spec"]["taints"], human]},
                "metadata": {
                    "labels": {LABEL_CORDONED: None},
                    "annotations": dict.fromkeys(OWN_ANNOTATIONS),
                },
            }
        )
        # Exported by kmock at run time, though not listed in its __all__.
        return kmock.Response(status=409, payload={"kind": "Status", "code": 409})  # type: ignore[attr-defined]

    emulator.call(lambda: emulator.handler["patch /api/v1/nodes/node-3"] << conflict_once)
    outcome = do_cordon(cluster)
    assert outcome.status is CompletionStatus.DONE
    assert len(calls) == 2  # patched, refused, read again, patched
    node = emulator.raw(NODES, None, "node-3")
    assert [t["key"] for t in node["spec"]["taints"]] == [
        "nvidia.com/gpu",
        "maintenance",
        "diagnoser.io/faulty",
    ]
    assert node["spec"]["unschedulable"] is True
