"""The operator API over real HTTP: a diagnosis becomes actions an operator claims and completes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from tests.conftest import run_service
from tests.servers import RedisServer, ServiceProcess, wait_until
from tests.servers import post_text as send

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
LIVE = {
    "DIAGNOSER_ACTIONS__DRY_RUN": "false",
    "DIAGNOSER_ACTIONS__BLAST_RADIUS_PERCENT": "100",
    "DIAGNOSER_ACTIONS__POLL_INTERVAL_S": "0.2",
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    yield from run_service({"DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data")), **LIVE})


def claim(service: ServiceProcess, operator: str = "op-a", **body: Any) -> list[dict[str, Any]]:
    answer = httpx.post(
        f"{service.base_url}/v1/actions/claim",
        json={"operator_id": operator, **body},
        timeout=40,
    )
    assert answer.status_code == 200, answer.text
    actions: list[dict[str, Any]] = answer.json()["actions"]
    return actions


def complete(
    service: ServiceProcess, action_id: int, operator: str = "op-a", **body: Any
) -> httpx.Response:
    return httpx.post(
        f"{service.base_url}/v1/actions/{action_id}/complete",
        json={"operator_id": operator, "status": "done", "message": "cordoned", **body},
    )


def listed(service: ServiceProcess, **params: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{service.base_url}/v1/actions", params=params)
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def test_an_operator_claims_the_cordon_then_the_restart(service: ServiceProcess) -> None:
    send(service, "train-1", "node-3", XID79)
    (cordon,) = claim(service, kinds=["cordon_node"], wait_seconds=20)
    assert cordon["target"]["node"] == "node-3"
    assert cordon["state"] == "claimed"
    assert cordon["lease_owner"] == "op-a"
    assert claim(service, kinds=["restart_job"]) == []  # waits for the cordon

    assert complete(service, cordon["id"], "op-b").status_code == 409
    done = complete(service, cordon["id"])
    assert done.status_code == 200
    again = complete(service, cordon["id"])
    assert again.json() == done.json()

    (restart,) = claim(service, kinds=["restart_job"])
    assert restart["job_id"] == "train-1"
    assert restart["depends_on"] == [cordon["id"]]
    moved = httpx.post(
        f"{service.base_url}/v1/actions/{restart['id']}/extend",
        json={"operator_id": "op-a", "lease_seconds": 120},
    )
    assert moved.status_code == 200
    refused = httpx.post(
        f"{service.base_url}/v1/actions/{restart['id']}/extend", json={"operator_id": "op-b"}
    )
    assert refused.status_code == 409
    assert refused.json()["error"] == "conflict"

    shown = httpx.get(f"{service.base_url}/v1/actions/{cordon['id']}").json()
    assert shown["state"] == "done"
    assert [d["decision"] for d in shown["decisions"]] == ["released", "claimed", "done"]
    assert [a["kind"] for a in listed(service, job_id="train-1", state="done")] == ["cordon_node"]
    assert httpx.get(f"{service.base_url}/v1/actions/999999").status_code == 404
    audit = httpx.get(f"{service.base_url}/v1/audit", params={"limit": 500}).json()["entries"]
    completed = [e for e in audit if e["action"] == "action.complete"]
    assert [e["subject"] for e in completed] == [str(cordon["id"])]  # once, not per repeat
    assert completed[0]["detail"] == {"operator_id": "op-a", "status": "done"}
    assert str(cordon["id"]) in {e["subject"] for e in audit if e["action"] == "action.claim"}

    # The diagnosis was wrong: on-call dismisses it, and the operator is asked to undo.
    dismissed = httpx.post(
        f"{service.base_url}/v1/diagnoses/{cordon['diagnosis_id']}/feedback",
        json={"kind": "dismiss", "author": "alice"},
    )
    assert dismissed.status_code == 201
    (undo,) = claim(service, kinds=["uncordon_node"])
    assert undo["target"] == {"node": "node-3", "undo_of": cordon["id"]}


def test_a_waiting_claim_is_answered_when_an_action_is_released(
    service: ServiceProcess,
) -> None:
    got: list[list[dict[str, Any]]] = []
    waiting = threading.Thread(
        target=lambda: got.append(claim(service, "op-w", kinds=["cordon_node"], wait_seconds=30))
    )
    waiting.start()
    send(service, "train-2", "node-5", XID79)
    waiting.join(40)
    assert [a["target"]["node"] for a in got[0]] == ["node-5"]


def test_the_stream_sends_each_state_change(service: ServiceProcess) -> None:
    events: list[str] = []
    connected = threading.Event()

    def watch() -> None:
        with httpx.stream("GET", f"{service.base_url}/v1/actions/stream", timeout=30) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            for line in answer.iter_lines():
                connected.set()
                if line.startswith("data: ") and '"node-6"' in line:
                    events.append(line)
                    return

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert connected.wait(20)
    send(service, "train-3", "node-6", XID79)
    watcher.join(40)
    assert events
    assert '"kind":"cordon_node"' in events[0]


def test_an_opted_out_node_is_left_alone(service: ServiceProcess) -> None:
    put = httpx.put(
        f"{service.base_url}/v1/nodes/node-7/opt-out", json={"reason": "burn-in", "author": "bob"}
    )
    assert put.status_code == 200
    assert put.json()["scope"] == "node"
    send(service, "train-4", "node-7", XID79)
    wait_until(lambda: listed(service, node="node-7"), 20, "the cordon decision")
    (cordon,) = listed(service, node="node-7")
    assert cordon["state"] == "suppressed"
    assert cordon["decisions"][0]["decision"] == "opt_out"
    assert httpx.delete(f"{service.base_url}/v1/nodes/node-7/opt-out").status_code == 204
    assert httpx.delete(f"{service.base_url}/v1/nodes/node-7/opt-out").status_code == 404
    assert httpx.put(f"{service.base_url}/v1/jobs/train-9/opt-out").status_code == 200


def test_bad_claims_get_the_error_body(service: ServiceProcess) -> None:
    answer = httpx.post(
        f"{service.base_url}/v1/actions/claim", json={"operator_id": "op-a", "max": 1000}
    )
    assert answer.status_code == 422
    assert set(answer.json()) == {"error", "detail"}


def test_released_actions_reach_the_redis_stream(tmp_path: Path, redis_server: RedisServer) -> None:
    env = {"DIAGNOSER_DATA_DIR": str(tmp_path), "DIAGNOSER_REDIS__URL": redis_server.url, **LIVE}
    client = Redis.from_url(redis_server.url)
    client.delete("diagnoser:actions")
    for process in run_service(env):
        send(process, "train-5", "node-8", XID79)

        def published() -> list[Any]:
            return list(client.xrange("diagnoser:actions") or [])

        wait_until(published, 20, "the action in the Redis stream")
        ((_, fields),) = published()
        assert fields[b"kind"] == b"cordon_node"
        (cordon,) = claim(process, kinds=["cordon_node"])
        assert fields[b"idempotency_key"].decode() == cordon["idempotency_key"]
    client.close()
