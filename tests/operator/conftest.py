"""The kmock Kubernetes emulator on loopback, driven by the real `kubernetes` client.

kmock serves a stateful emulation of the API (create, read, merge and JSON patch, delete, list)
from an aiohttp server. It runs here on its own event loop in a thread, so that the synchronous
official client (which the operator calls from worker threads) can talk to it from any test,
sync or async. Differences from a real API server that the operator must survive are noted where
a test depends on them (no label selectors, no resourceVersion, no controllers)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, Self, TypeVar

import kmock
import pytest

from diagnoser.operator.cluster import Cluster, connect_url
from diagnoser.operator.wire import ActionKind, ActionState, ActionView

T = TypeVar("T")

RESOURCES = {
    "v1/nodes": ("Node", False),
    "v1/pods": ("Pod", True),
    "batch/v1/jobs": ("Job", True),
    "kubeflow.org/v1/pytorchjobs": ("PyTorchJob", True),
    "jobset.x-k8s.io/v1alpha2/jobsets": ("JobSet", True),
}


class FromDict(Protocol):
    @classmethod
    def from_dict(cls, obj: dict[str, Any] | None) -> Self | None: ...


M = TypeVar("M", bound=FromDict)


def model(cls: type[M], body: dict[str, Any]) -> M:
    """A typed request body for the client from plain JSON (camelCase keys)."""
    built = cls.from_dict(body)
    assert built is not None
    return built


@dataclass
class Emulator:
    handler: kmock.KubernetesEmulator
    url: str
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the emulator's loop: its state is only touched from that thread."""
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed back to the caller's thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=10)

    def raw(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored object as plain JSON, read from the emulator (not through the client)."""

        def read() -> dict[str, Any]:
            obj = self.handler.objects[resource, namespace, name]
            return obj.raw

        return self.call(read)

    def exists(self, resource: str, namespace: str | None, name: str) -> bool:
        def check() -> bool:
            key = (resource, namespace, name)
            return key in self.handler.objects and not self.handler.objects[key].deleted

        return self.call(check)

    def patch(self, resource: str, namespace: str | None, name: str, body: dict[str, Any]) -> None:
        """Change an object as a controller or a person would (merge semantics)."""
        self.call(lambda: self.handler.objects[resource, namespace, name].patch(body))

    def versions(self, resource: str, namespace: str | None, name: str) -> int:
        """How many versions the object went through: one per create or patch."""
        return self.call(lambda: len(self.handler.objects[resource, namespace, name].history))

    def names(self, resource: str, namespace: str | None = None) -> list[str]:
        def list_names() -> list[str]:
            return sorted(
                name
                for (res, ns, name), obj in self.handler.objects.items()
                if str(res) == str(kmock.resource(resource))
                and (namespace is None or ns == namespace)
                and not obj.deleted
            )

        return self.call(list_names)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
            for resource, (kind, namespaced) in RESOURCES.items():
                handler.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
            stop = asyncio.Event()
            box.update(handler=handler, url=str(server.url), stop=stop)
            box["loop"] = asyncio.get_running_loop()
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert started.wait(timeout=10), "kmock did not start"
    emu = Emulator(handler=box["handler"], url=box["url"], loop=box["loop"])
    try:
        yield emu
    finally:
        emu.loop.call_soon_threadsafe(box["stop"].set)
        thread.join(timeout=10)


@pytest.fixture
def cluster(emulator: Emulator) -> Iterator[Cluster]:
    connected = connect_url(emulator.url)
    try:
        yield connected
    finally:
        connected.api.close()  # type: ignore[no-untyped-call]


T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def action(
    action_id: int,
    kind: ActionKind,
    target: dict[str, Any],
    *,
    job_id: str = "train-42",
    created_at: datetime = T0,
    reason: str = "xid 79 on node-3 (rule gpu-xid-79)",
) -> ActionView:
    """An action as the service would hand it out on claim."""
    return ActionView(
        id=action_id,
        diagnosis_id="3f2a9c1e-0000-4000-8000-000000000001",
        job_id=job_id,
        kind=kind,
        target=target,
        reason=reason,
        source="rules",
        idempotency_key=f"{kind}:{action_id}",
        state=ActionState.CLAIMED,
        lease_owner="op-test",
        attempts=1,
        created_at=created_at,
        updated_at=created_at,
    )
