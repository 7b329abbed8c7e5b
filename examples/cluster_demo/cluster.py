"""The demo's Kubernetes cluster: a kmock API emulator on loopback, and a stand-in controller.

`kmock.KubernetesEmulator` stores objects and serves the Kubernetes REST API to any client
(the official `kubernetes` client of `diagnoser operator` included), but runs no controllers:
nothing recreates a deleted pod. `WorkerController` plays the Kubeflow training operator and
the scheduler for the demo's PyTorchJob: a worker pod that disappears is created again, bound to
a Node that is schedulable, untainted and free (each worker takes all 8 GPUs of a node), or left
`Pending` with the scheduler's `Unschedulable` reason when no such node is left.

The emulator ignores label selectors on lists (it returns every pod of the namespace), so the
bystander pod in the job's namespace, which the job does not own, shows whether a restart
touched only the job's pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kmock
import yaml

NAMESPACE = "ml"
JOB_LABEL = "diagnoser.io/job"
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"
GPUS_PER_NODE = 8
BYSTANDER_POD = "tensorboard-0"
POLL_SECONDS = 0.05

JsonObject = dict[str, Any]


def node_names(count: int) -> list[str]:
    return [f"node-{index}" for index in range(count)]


def worker_name(job_id: str, rank: int) -> str:
    return f"{job_id}-worker-{rank}"


def node_object(name: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
            },
        },
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "192", "memory": "2Ti"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pytorchjob_object(job_id: str, workers: int) -> JsonObject:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job_id, "namespace": NAMESPACE, "uid": str(uuid.uuid4())},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [{"name": "pytorch"}]}},
                }
            },
            "runPolicy": {"backoffLimit": 3},
        },
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }


def worker_object(job_id: str, owner_uid: str, rank: int, attempt: int) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": worker_name(job_id, rank),
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "labels": {
                JOB_LABEL: job_id,
                KUBEFLOW_JOB_LABEL: job_id,
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(rank),
            },
            "annotations": {"demo.diagnoser.io/attempt": str(attempt)},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": job_id,
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_NODE)}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def bystander_object() -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": BYSTANDER_POD,
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "labels": {"app": "tensorboard"},
        },
        "spec": {"nodeName": "node-0", "containers": [{"name": "tensorboard"}]},
        "status": {"phase": "Running"},
    }


def blocking_taints(node: JsonObject) -> list[JsonObject]:
    """Taints that keep a pod without tolerations off the node."""
    taints: list[JsonObject] = node.get("spec", {}).get("taints") or []
    return [taint for taint in taints if taint.get("effect") in {"NoSchedule", "NoExecute"}]


def is_cordoned(node: JsonObject) -> bool:
    return bool(node.get("spec", {}).get("unschedulable"))


def is_schedulable(node: JsonObject) -> bool:
    return not is_cordoned(node) and not blocking_taints(node)


def kubeconfig(server: str) -> JsonObject:
    """A kubeconfig for the emulator: plain HTTP on loopback, no credentials."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "demo", "cluster": {"server": server}}],
        "users": [{"name": "demo", "user": {}}],
        "contexts": [
            {"name": "demo", "context": {"cluster": "demo", "user": "demo", "namespace": NAMESPACE}}
        ],
        "current-context": "demo",
    }


@dataclass
class Recreation:
    """One worker pod the controller created again after it was deleted."""

    pod: str
    node: str | None
    phase: str
    attempt: int


class KubernetesApi:
    """The few reads and writes of the demo, over HTTP, as any client of the emulator does."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=10)

    async def close(self) -> None:
        await self.http.aclose()

    async def nodes(self) -> list[JsonObject]:
        response = await self.http.get("/api/v1/nodes")
        response.raise_for_status()
        items: list[JsonObject] = response.json()["items"]
        return sorted(items, key=lambda item: str(item["metadata"]["name"]))

    async def pods(self) -> list[JsonObject]:
        response = await self.http.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
        response.raise_for_status()
        items: list[JsonObject] = response.json()["items"]
        return sorted(items, key=lambda item: str(item["metadata"]["name"]))

    async def pod(self, name: str) -> JsonObject | None:
        response = await self.http.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        pod: JsonObject = response.json()
        return pod

    async def create_pod(self, pod: JsonObject) -> None:
        response = await self.http.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod)
        response.raise_for_status()


@dataclass
class WorkerController:
    """Recreates deleted worker pods of one PyTorchJob, placed as the scheduler would."""

    api: KubernetesApi
    job_id: str
    owner_uid: str
    workers: int
    on_recreate: Callable[[Recreation], None]
    attempts: dict[int, int] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(POLL_SECONDS)

    async def reconcile(self) -> None:
        pods = {pod["metadata"]["name"]: pod for pod in await self.api.pods()}
        missing = [r for r in range(self.workers) if worker_name(self.job_id, r) not in pods]
        if not missing:
            return
        busy = {
            pod.get("spec", {}).get("nodeName")
            for pod in pods.values()
            if pod["metadata"].get("labels", {}).get(JOB_LABEL) == self.job_id
        }
        nodes = await self.api.nodes()
        free = [
            str(n["metadata"]["name"])
            for n in nodes
            if is_schedulable(n) and n["metadata"]["name"] not in busy
        ]
        # A worker goes back to the node it ran on when that node is still fine; the others
        # take what is left, in rank order.
        placement: dict[int, str | None] = {}
        for rank in missing:
            if f"node-{rank}" in free:
                placement[rank] = f"node-{rank}"
                free.remove(f"node-{rank}")
        for rank in missing:
            if rank not in placement:
                placement[rank] = free.pop(0) if free else None
        taken = busy | {node for node in placement.values() if node is not None}
        for rank in missing:
            attempt = self.attempts.get(rank, 0) + 1
            self.attempts[rank] = attempt
            pod = worker_object(self.job_id, self.owner_uid, rank, attempt)
            node = placement[rank]
            if node is None:
                pod["status"] = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": unschedulable_message(nodes, taken),
                        }
                    ],
                }
            else:
                pod["spec"]["nodeName"] = node
                pod["status"] = {"phase": "Running"}
            await self.api.create_pod(pod)
            phase = str(pod["status"]["phase"])
            self.on_recreate(Recreation(worker_name(self.job_id, rank), node, phase, attempt))


def unschedulable_message(nodes: list[JsonObject], busy: set[str | None]) -> str:
    """The scheduler's summary of why no node fits, in its own wording."""
    reasons: list[str] = []
    cordoned = sum(1 for n in nodes if is_cordoned(n))
    tainted = [n for n in nodes if blocking_taints(n)]
    if tainted:
        taint = blocking_taints(tainted[0])[0]
        reasons.append(
            f"{len(tainted)} node(s) had untolerated taint {{{taint.get('key')}: "
            f"{taint.get('value', '')}}}"
        )
    if cordoned and not tainted:
        reasons.append(f"{cordoned} node(s) were unschedulable")
    full = sum(1 for n in nodes if is_schedulable(n) and n["metadata"]["name"] in busy)
    if full:
        reasons.append(f"{full} Insufficient nvidia.com/gpu")
    return f"0/{len(nodes)} nodes are available: {', '.join(reasons)}."


@dataclass
class EmulatedCluster:
    """The emulator's address, its seeded objects, and the controller's record."""

    url: str
    kubeconfig_path: Path
    api: KubernetesApi
    job_id: str
    nodes: list[str]
    recreations: list[Recreation]


@contextlib.asynccontextmanager
async def emulated_cluster(
    job_id: str,
    workers: int,
    work_dir: Path,
    *,
    spare_nodes: int = 0,
    on_recreate: Callable[[Recreation], None] | None = None,
) -> AsyncIterator[EmulatedCluster]:
    """Start the emulator with the Nodes, the PyTorchJob and its running worker pods."""
    names = node_names(workers + spare_nodes)
    job = pytorchjob_object(job_id, workers)
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.objects["v1/namespaces", None, NAMESPACE] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE},
        }
        for name in names:
            emulator.objects["v1/nodes", None, name] = node_object(name)
        emulator.objects["kubeflow.org/v1/pytorchjobs", NAMESPACE, job_id] = job
        for rank in range(workers):
            pod = worker_object(job_id, job["metadata"]["uid"], rank, attempt=0)
            pod["spec"]["nodeName"] = names[rank]
            pod["status"] = {"phase": "Running"}
            emulator.objects["v1/pods", NAMESPACE, pod["metadata"]["name"]] = pod
        emulator.objects["v1/pods", NAMESPACE, BYSTANDER_POD] = bystander_object()

        url = str(server.url).rstrip("/")
        config_path = work_dir / "kubeconfig.yaml"
        config_path.write_text(yaml.safe_dump(kubeconfig(url), sort_keys=False))
        api = KubernetesApi(url)
        recreations: list[Recreation] = []

        def record(recreation: Recreation) -> None:
            recreations.append(recreation)
            if on_recreate is not None:
                on_recreate(recreation)

        controller = WorkerController(api, job_id, job["metadata"]["uid"], workers, record)
        task = asyncio.create_task(controller.run())
        try:
            yield EmulatedCluster(url, config_path, api, job_id, names, recreations)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await api.close()
