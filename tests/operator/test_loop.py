"""The claim loop over real HTTP (a scripted action server on uvicorn) and kmock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes.client import V1Node, V1Pod

from diagnoser.operator.client import ActionClient
from diagnoser.operator.cluster import Cluster
from diagnoser.operator.executor import Executor
from diagnoser.operator.loop import LoopSettings, Operator
from diagnoser.operator.verify import VerifySettings
from diagnoser.operator.wire import ActionKind
from tests.operator.actionserver import ScriptedActions, serving
from tests.operator.conftest import Emulator, action, model
from tests.operator.test_cordon import CORDON
from tests.operator.test_verify import scripted_cluster

FAST = LoopSettings(
    operator_id="op-a", wait_seconds=1, lease_seconds=30, attempts=3, backoff_seconds=0.01
)


async def until(predicate: Callable[[], bool]) -> None:
    """Wait for the loop to get somewhere; the bound only keeps a broken run from hanging.

    Polled: the state sits in other threads (kmock) and behind HTTP, with no event to await."""
    async with asyncio.timeout(30):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@dataclass
class Running:
    script: ScriptedActions
    operator: Operator
    stop: asyncio.Event


@asynccontextmanager
async def running(
    script: ScriptedActions,
    cluster: Cluster,
    settings: LoopSettings = FAST,
    *,
    token: str | None = "s3cret",
    **executor: Any,
) -> AsyncIterator[Running]:
    async with serving(script) as url, ActionClient(url, token=token) as client:
        operator = Operator(client, Executor(cluster=cluster, **executor), settings)
        stop = asyncio.Event()
        task = asyncio.create_task(operator.run(stop))
        try:
            yield Running(script, operator, stop)
        finally:
            stop.set()
            await task


def node_and_pods(cluster: Cluster) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-3", "labels": {}}}
    cluster.core.create_node(model(V1Node, body))
    for rank in range(2):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"rank-{rank}",
                "namespace": "ml",
                "labels": {"diagnoser.io/job": "train-42"},
            },
            "spec": {"containers": [{"name": "c", "image": "trainer:1"}]},
            "status": {"phase": "Running"},
        }
        cluster.core.create_namespaced_pod("ml", model(V1Pod, pod))


def cordon_then_restart(script: ScriptedActions) -> None:
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    restart = action(2, ActionKind.RESTART_JOB, {"namespace": None, "workload_kind": None})
    script.add(restart.model_copy(update={"depends_on": [1]}))


async def test_a_plan_runs_in_order_and_reports(cluster: Cluster, emulator: Emulator) -> None:
    node_and_pods(cluster)
    script = ScriptedActions()
    cordon_then_restart(script)
    async with running(script, cluster):
        await until(lambda: script.state(2) != "pending" and script.state(2) != "claimed")
    assert [action_id for action_id, _ in script.completions] == [1, 2]
    assert script.state(1) == "done"
    assert script.state(2) == "done"
    assert script.actions[2]["result"]["deleted"] == ["ml/rank-0", "ml/rank-1"]
    assert emulator.raw("v1/nodes", None, "node-3")["spec"]["unschedulable"] is True
    assert emulator.names("v1/pods") == []
    assert set(script.authorizations) == {"Bearer s3cret"}


async def test_redelivery_of_a_done_action_is_idempotent(
    cluster: Cluster, emulator: Emulator
) -> None:
    node_and_pods(cluster)
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    async with running(script, cluster):
        await until(lambda: script.state(1) == "done")
        versions = emulator.versions("v1/nodes", None, "node-3")
        first = script.completions[-1][1]
        script.redeliver(1)
        await until(lambda: len(script.completions) == 2)
    assert script.completions[1][1] == first  # the remembered outcome, reported again
    assert emulator.versions("v1/nodes", None, "node-3") == versions

    # Another operator process, which remembers nothing: the cluster itself makes it a no-op.
    script.redeliver(1)
    other = LoopSettings(operator_id="op-b", wait_seconds=1, backoff_seconds=0.01)
    async with running(script, cluster, other):
        await until(lambda: len(script.completions) == 3)
    assert script.completions[2][1]["status"] == "done"
    assert script.completions[2][1]["result"] == {"node": "node-3", "replayed": True}
    assert emulator.versions("v1/nodes", None, "node-3") == versions


async def test_a_failing_kubernetes_call_is_retried_then_reported(
    cluster: Cluster, emulator: Emulator
) -> None:
    node_and_pods(cluster)
    reads = emulator.call(lambda: emulator.handler["get /api/v1/nodes/node-3"])
    emulator.call(lambda: reads << 503)
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    async with running(script, cluster):
        await until(lambda: script.state(1) == "failed")
    body = script.completions[0][1]
    assert body["status"] == "failed"
    assert body["message"] == "Kubernetes API 503 Service Unavailable (gave up after 3 attempts)"
    assert emulator.call(lambda: len(reads)) == 3
    assert "unschedulable" not in emulator.raw("v1/nodes", None, "node-3").get("spec", {})


async def test_a_permanent_kubernetes_error_is_reported_at_once(cluster: Cluster) -> None:
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))  # no such node
    async with running(script, cluster):
        await until(lambda: script.state(1) == "failed")
    message = script.completions[0][1]["message"]
    assert message.startswith("Kubernetes API 404")
    assert "gave up" not in message


async def test_the_loop_survives_a_service_outage(cluster: Cluster, emulator: Emulator) -> None:
    node_and_pods(cluster)
    script = ScriptedActions(failing_claims=2)
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    async with running(script, cluster):
        await until(lambda: script.state(1) == "done")
    assert len(script.authorizations) >= 3


async def test_dry_run_completes_with_the_plan_and_changes_nothing(
    cluster: Cluster, emulator: Emulator
) -> None:
    node_and_pods(cluster)
    original = emulator.raw("v1/nodes", None, "node-3")
    script = ScriptedActions()
    cordon_then_restart(script)
    async with running(script, cluster, dry_run=True):
        await until(lambda: script.state(2) == "done")
    assert script.actions[1]["result"]["dry_run"] is True
    assert script.actions[2]["result"]["would_delete"] == ["ml/rank-0", "ml/rank-1"]
    assert emulator.raw("v1/nodes", None, "node-3") == original
    assert emulator.names("v1/pods") == ["rank-0", "rank-1"]


def verify_cluster(cluster: Cluster) -> None:
    for name in ("node-0", "node-1", "good-0"):
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        cluster.core.create_node(model(V1Node, body))


QUICK_VERIFY = VerifySettings(poll_seconds=0.02, timeout_seconds=30, gpus_per_node=0)


async def test_the_lease_is_extended_while_a_verification_runs(
    cluster: Cluster, emulator: Emulator
) -> None:
    verify_cluster(cluster)
    script = ScriptedActions()
    script.add(action(5, ActionKind.VERIFY_NODES, {"nodes": ["node-0", "node-1"]}))
    settings = LoopSettings(
        operator_id="op-a", wait_seconds=1, backoff_seconds=0.01, extend_every_seconds=0.05
    )
    async with running(script, cluster, settings, verify=QUICK_VERIFY):
        # The Jobs get their outcome only once the operator has extended its lease.
        await until(lambda: len(script.extensions) >= 2)
        with scripted_cluster(emulator, bad=set()):
            await until(lambda: script.state(5) == "done")
    assert script.actions[5]["result"]["failed_nodes"] == []
    assert set(script.extensions) == {5}


async def test_stop_leaves_a_verification_to_its_lease(
    cluster: Cluster, emulator: Emulator
) -> None:
    verify_cluster(cluster)
    script = ScriptedActions()
    script.add(action(5, ActionKind.VERIFY_NODES, {"nodes": ["node-0", "node-1"]}))
    async with running(script, cluster, verify=QUICK_VERIFY) as run:
        await until(lambda: emulator.names("batch/v1/jobs", "diagnoser") != [])
        run.stop.set()
    assert script.completions == []
    assert script.state(5) == "claimed"
    # The test Job stays for the next delivery to pick up.
    assert emulator.names("batch/v1/jobs", "diagnoser") == ["diagnoser-verify-5-r1-g0"]


async def test_an_unexpected_object_shape_fails_the_action_not_the_loop(
    cluster: Cluster, emulator: Emulator
) -> None:
    node_and_pods(cluster)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train-42", "namespace": "ml"},
        "spec": {"runPolicy": {"backoffLimit": "three"}},
    }
    cluster.custom.create_namespaced_custom_object("kubeflow.org", "v1", "ml", "pytorchjobs", job)
    script = ScriptedActions()
    target = {"namespace": "ml", "workload_kind": "PyTorchJob", "name": "train-42"}
    script.add(action(1, ActionKind.RESTART_JOB, target))
    script.add(action(2, ActionKind.CORDON_NODE, CORDON))
    async with running(script, cluster):
        await until(lambda: script.state(1) == "failed" and script.state(2) == "done")
    (message,) = [body["message"] for action_id, body in script.completions if action_id == 1]
    assert message.startswith("operator error: ValueError")


async def test_a_redelivered_failed_action_is_tried_again(
    cluster: Cluster, emulator: Emulator
) -> None:
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))  # the node is not there yet
    async with running(script, cluster):
        await until(lambda: script.state(1) == "failed")
        node_and_pods(cluster)
        script.redeliver(1)
        await until(lambda: script.state(1) == "done")
    assert emulator.raw("v1/nodes", None, "node-3")["spec"]["unschedulable"] is True
