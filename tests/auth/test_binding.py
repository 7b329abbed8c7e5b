"""An ingest token bound to node-a speaks for node-a only: it cannot post into another node's
streams or jobs outside its pattern, and a line it sends that names node-b as the failed host
implicates node-a, never node-b."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.auth.issuing import Token, create_token
from tests.servers import ServiceProcess, wait_until

NAMES_NODE_B = [
    "srun: error: node-b: task 3: Killed\n",
    "slurmstepd: error: *** JOB 4412 ON node-b CANCELLED AT 2024-05-01T10:22:01 ***\n",
    "mpirun noticed that process rank 5 with PID 0 on node node-b exited on signal 9 (Killed).\n",
]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Token]:
    data_dir = tmp_path_factory.mktemp("binding")
    return {
        "dir": Token("", str(data_dir)),
        "admin": create_token(data_dir, "admin"),
        "read": create_token(data_dir, "read"),
        "node-a": create_token(data_dir, "ingest", "--node", "node-a", "--jobs", "train-*"),
    }


@pytest.fixture(scope="module")
def service(tokens: dict[str, Token]) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": tokens["dir"].raw})
    process.start()
    yield process
    process.stop()


def post(
    service: ServiceProcess,
    token: Token,
    job: str,
    body: str,
    *,
    content_type: str = "text/plain",
    **params: str,
) -> httpx.Response:
    return httpx.post(
        f"{service.base_url}/v1/jobs/{job}/logs",
        params={"node": "node-a", **params},
        content=body.encode(),
        headers={"Content-Type": content_type, **token.headers},
    )


@pytest.mark.parametrize(
    ("job", "params", "detail"),
    [
        ("train-1", {"node": "node-b"}, "bound to node 'node-a' and may not speak for 'node-b'"),
        ("eval-1", {}, "may post only for jobs matching 'train-*', not 'eval-1'"),
        ("train-1", {"stream": "node-b/0"}, "stream 'node-b/0' is not one of its"),
    ],
)
def test_a_bound_token_posts_only_for_its_node_and_jobs(
    service: ServiceProcess,
    tokens: dict[str, Token],
    job: str,
    params: dict[str, str],
    detail: str,
) -> None:
    response = post(service, tokens["node-a"], job, "step 1 loss 2.0\n", **params)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert detail in response.json()["detail"]


def test_records_naming_another_node_are_refused(
    service: ServiceProcess, tokens: dict[str, Token]
) -> None:
    records = json.dumps({"line": "step 1 loss 2.0", "node": "node-b"}) + "\n"
    response = post(
        service, tokens["node-a"], "train-2", records, content_type="application/x-ndjson"
    )
    assert response.status_code == 403
    assert "may not speak for 'node-b'" in response.json()["detail"]
    own = json.dumps({"line": "step 1 loss 2.0", "node": "node-a"}) + "\n"
    accepted = post(service, tokens["node-a"], "train-2", own, content_type="application/x-ndjson")
    assert accepted.status_code == 200, accepted.text


def test_job_events_for_another_node_are_refused(
    service: ServiceProcess, tokens: dict[str, Token]
) -> None:
    url = f"{service.base_url}/v1/jobs/train-3/events"
    other = httpx.post(
        url, json={"type": "started", "node": "node-b"}, headers=tokens["node-a"].headers
    )
    assert other.status_code == 403
    unnamed = httpx.post(url, json={"type": "started"}, headers=tokens["node-a"].headers)
    assert unnamed.status_code == 201, unnamed.text
    assert unnamed.json()["node"] == "node-a"


def _culprits(service: ServiceProcess, token: Token, job: str) -> list[str]:
    def settled() -> list[dict[str, Any]] | None:
        body = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses", headers=token.headers)
        assert body.status_code == 200, body.text
        found: list[dict[str, Any]] = body.json()["diagnoses"]
        return found or None

    wait_until(settled, 20, f"a diagnosis of {job}")
    found = settled()
    assert found is not None
    return sorted({node for d in found for node in d["culprit_nodes"]})


@pytest.mark.parametrize("line", NAMES_NODE_B, ids=["srun", "slurmstepd", "mpirun"])
def test_a_line_naming_node_b_implicates_only_the_bound_node(
    service: ServiceProcess, tokens: dict[str, Token], line: str
) -> None:
    index = NAMES_NODE_B.index(line)
    # The same line over an unbound token names node-b: the text alone would implicate it.
    control = f"train-control-{index}"
    assert post(service, tokens["admin"], control, line).status_code == 200
    assert _culprits(service, tokens["read"], control) == ["node-b"]

    bound = f"train-bound-{index}"
    assert post(service, tokens["node-a"], bound, line).status_code == 200
    assert _culprits(service, tokens["read"], bound) == ["node-a"]
    nodes = httpx.get(f"{service.base_url}/v1/nodes/node-b", headers=tokens["read"].headers)
    history = nodes.json().get("history", []) if nodes.status_code == 200 else []
    assert all(d["job_id"] != bound for d in history)
