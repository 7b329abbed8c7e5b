"""The demo's emulated cluster: kmock over real HTTP, and the stand-in for the job's controller."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import yaml

from examples.cluster_demo.cluster import (
    BYSTANDER_POD,
    NAMESPACE,
    EmulatedCluster,
    Recreation,
    emulated_cluster,
)

WORKERS = [f"train-demo-worker-{rank}" for rank in range(4)]


async def cordon(cluster: EmulatedCluster, node: str) -> None:
    """What `diagnoser operator` does to a Node, as far as the scheduler is concerned."""
    async with httpx.AsyncClient(base_url=cluster.url) as http:
        response = await http.patch(
            f"/api/v1/nodes/{node}",
            json={
                "spec": {
                    "unschedulable": True,
                    "taints": [
                        {"key": "diagnoser.io/faulty", "value": "xid_79", "effect": "NoSchedule"}
                    ],
                }
            },
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()


async def delete_workers(cluster: EmulatedCluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url) as http:
        for name in WORKERS:
            response = await http.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
            response.raise_for_status()


class Recreations:
    """What the controller reported; `all_back` is set once every worker was created again."""

    def __init__(self) -> None:
        self.seen: list[Recreation] = []
        self.all_back = asyncio.Event()

    def __call__(self, recreation: Recreation) -> None:
        self.seen.append(recreation)
        if {r.pod for r in self.seen} == set(WORKERS):
            self.all_back.set()

    async def wait(self) -> None:
        async with asyncio.timeout(60):
            await self.all_back.wait()


async def test_the_emulator_serves_the_seeded_cluster(tmp_path: Path) -> None:
    async with emulated_cluster("train-demo", 4, tmp_path) as cluster:
        nodes = await cluster.api.nodes()
        pods = await cluster.api.pods()
        config = yaml.safe_load(cluster.kubeconfig_path.read_text())

    assert [n["metadata"]["name"] for n in nodes] == ["node-0", "node-1", "node-2", "node-3"]
    assert not any(n["spec"].get("unschedulable") for n in nodes)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted([BYSTANDER_POD, *WORKERS])
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    assert [placed[name] for name in WORKERS] == ["node-0", "node-1", "node-2", "node-3"]
    assert config["clusters"][0]["cluster"]["server"] == cluster.url


async def test_deleted_workers_come_back_away_from_the_cordoned_node(tmp_path: Path) -> None:
    recreations = Recreations()
    async with emulated_cluster("train-demo", 4, tmp_path, on_recreate=recreations) as c:
        await cordon(c, "node-2")
        await delete_workers(c)
        await recreations.wait()
        pods = {p["metadata"]["name"]: p for p in await c.api.pods()}

    for rank in (0, 1, 3):
        pod = pods[f"train-demo-worker-{rank}"]
        assert pod["spec"]["nodeName"] == f"node-{rank}"
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["annotations"]["demo.diagnoser.io/attempt"] == "1"
    stuck = pods["train-demo-worker-2"]
    assert "nodeName" not in stuck["spec"]
    assert stuck["status"]["phase"] == "Pending"
    [condition] = stuck["status"]["conditions"]
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == (
        "0/4 nodes are available: 1 node(s) had untolerated taint {diagnoser.io/faulty: xid_79}, "
        "3 Insufficient nvidia.com/gpu."
    )
    assert BYSTANDER_POD in pods


async def test_a_spare_node_takes_the_worker_of_the_cordoned_node(tmp_path: Path) -> None:
    recreations = Recreations()
    async with emulated_cluster(
        "train-demo", 4, tmp_path, spare_nodes=1, on_recreate=recreations
    ) as cluster:
        await cordon(cluster, "node-2")
        await delete_workers(cluster)
        await recreations.wait()
        pods = {p["metadata"]["name"]: p for p in await cluster.api.pods()}

    assert pods["train-demo-worker-2"]["spec"]["nodeName"] == "node-4"
    assert pods["train-demo-worker-2"]["status"]["phase"] == "Running"
