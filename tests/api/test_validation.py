"""Bad input is a 4xx with the JSON error body, the same on SQLite and PostgreSQL, never a 500.

PostgreSQL refuses NUL in text, 32-bit overflows in INTEGER and values wider than VARCHAR(n);
SQLite accepts all three. Ids, ranks and lengths are therefore checked at the API edge.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess

OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
NDJSON = {"Content-Type": "application/x-ndjson"}
JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}
RLO = "\u202e"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    yield from run_service(backend_env(request, tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def diagnosis_id(service: ServiceProcess) -> str:
    response = httpx.post(
        f"{service.base_url}/v1/jobs/seed/logs", params={"node": "gpu-1"}, content=OOM, headers=TEXT
    )
    assert response.status_code == 200, response.text
    diagnoses: list[str] = response.json()["diagnoses"]
    return diagnoses[0]


@dataclass(frozen=True)
class Bad:
    """One bad request: `{diagnosis}` in the path is replaced by a real diagnosis id."""

    name: str
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _ndjson(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


LOGS = "/v1/jobs/bad/logs"
EVENTS = "/v1/jobs/bad/events"
FEEDBACK = "/v1/diagnoses/{diagnosis}/feedback"
DEEP = b"[" * 100_000 + b"]" * 100_000
BAD = [
    Bad("event rank 2^31", "POST", EVENTS, json={"type": "started", "rank": 2**31}),
    Bad("event rank 2^63", "POST", EVENTS, json={"type": "started", "rank": 2**63}),
    Bad("event rank -1", "POST", EVENTS, json={"type": "started", "rank": -1}),
    Bad("event rank true", "POST", EVENTS, json={"type": "started", "rank": True}),
    Bad("event signal of 33", "POST", EVENTS, json={"type": "exited", "signal": "S" * 33}),
    Bad("event signal 10^40", "POST", EVENTS, json={"type": "exited", "signal": 10**40}),
    Bad("event signal NUL", "POST", EVENTS, json={"type": "exited", "signal": "KILL\x00"}),
    Bad("event ts false", "POST", EVENTS, json={"type": "started", "ts": False}),
    Bad("event ts digits", "POST", EVENTS, json={"type": "started", "ts": "1700000000"}),
    Bad(
        "event ts year 1", "POST", EVENTS, json={"type": "started", "ts": "0001-01-01T00:00+01:00"}
    ),
    Bad("event node NUL", "POST", EVENTS, json={"type": "started", "node": "gpu\x00"}),
    *(
        Bad(f"record rank {rank!r}", "POST", LOGS, {"node": "n"}, None, body, NDJSON)
        for rank in (2**31, 2**63, -1, "2147483648")
        for body in [_ndjson({"line": "x", "rank": rank})]
    ),
    Bad(
        "fluent bit rank 2^63",
        "POST",
        LOGS,
        {"node": "n"},
        content=json.dumps([{"log": "x", "rank": 2**63}]).encode(),
        headers=JSON,
    ),
    Bad(
        "record node NUL",
        "POST",
        LOGS,
        {"node": "n"},
        None,
        _ndjson({"line": "x", "node": "a\x00"}),
        NDJSON,
    ),
    Bad(
        "record node of 254",
        "POST",
        LOGS,
        {"node": "n"},
        None,
        _ndjson({"line": "x", "node": "a" * 254}),
        NDJSON,
    ),
    Bad(
        "record node of 600",
        "POST",
        LOGS,
        {"node": "n"},
        None,
        _ndjson({"line": "x", "node": "a" * 600}),
        NDJSON,
    ),
    Bad(
        "record node RLO",
        "POST",
        LOGS,
        {"node": "n"},
        None,
        _ndjson({"line": "x", "node": f"a{RLO}b"}),
        NDJSON,
    ),
    Bad(
        "kubernetes host NUL",
        "POST",
        LOGS,
        {"node": "n"},
        content=json.dumps([{"log": "x", "kubernetes": {"host": "h\x00"}}]).encode(),
        headers=JSON,
    ),
    Bad("framework of 65", "PUT", "/v1/jobs/bad", json={"framework": "f" * 65}),
    Bad("kind of 65", "PUT", "/v1/jobs/bad", json={"kind": "k" * 65}),
    Bad(
        "framework header of 65",
        "POST",
        LOGS,
        {"node": "n"},
        content=b"x\n",
        headers={**TEXT, "X-Diagnoser-Job-Framework": "f" * 65},
    ),
    Bad("put 100000 deep", "PUT", "/v1/jobs/bad", content=DEEP, headers=JSON),
    Bad("ndjson 100000 deep", "POST", LOGS, {"node": "n"}, content=DEEP, headers=NDJSON),
    Bad("json 100000 deep", "POST", LOGS, {"node": "n"}, content=DEEP, headers=JSON),
    Bad("stream NUL", "POST", LOGS, {"node": "n", "stream": "s\x00"}, content=b"x\n", headers=TEXT),
    Bad(
        "stream ../", "POST", LOGS, {"node": "n", "stream": "../etc"}, content=b"x\n", headers=TEXT
    ),
    Bad(
        "stream a/../b",
        "POST",
        LOGS,
        {"node": "n", "stream": "a/../b"},
        content=b"x\n",
        headers=TEXT,
    ),
    Bad(
        "stream RLO",
        "POST",
        LOGS,
        {"node": "n", "stream": f"a{RLO}b"},
        content=b"x\n",
        headers=TEXT,
    ),
    Bad(
        "stream of 513",
        "POST",
        LOGS,
        {"node": "n", "stream": "s" * 513},
        content=b"x\n",
        headers=TEXT,
    ),
    Bad("get stream NUL", "GET", LOGS, {"node": "n", "stream": "s\x00"}),
    Bad(
        "query rank 2^31", "POST", LOGS, {"node": "n", "rank": 2**31}, content=b"x\n", headers=TEXT
    ),
    Bad("offset 2^63", "POST", LOGS, {"node": "n", "offset": 2**63}, content=b"x\n", headers=TEXT),
    Bad("feedback author NUL", "POST", FEEDBACK, json={"kind": "confirm", "author": "a\x00"}),
    Bad(
        "feedback comment NUL",
        "POST",
        FEEDBACK,
        json={"kind": "confirm", "author": "a", "comment": "ok\x00"},
    ),
    Bad(
        "feedback action without override",
        "POST",
        FEEDBACK,
        json={"kind": "confirm", "author": "a", "action": "none"},
    ),
    Bad("feedback override of nothing", "POST", FEEDBACK, json={"kind": "override", "author": "a"}),
    Bad("node NUL", "GET", "/v1/nodes/gpu%00"),
    Bad("diagnosis id NUL", "GET", "/v1/diagnoses/ab%00"),
    Bad("diagnoses job NUL", "GET", "/v1/diagnoses", {"job": "j\x00"}),
    Bad("diagnoses node NUL", "GET", "/v1/diagnoses", {"node": "n\x00"}),
    Bad("diagnoses since digits", "GET", "/v1/diagnoses", {"since": "1700000000"}),
    Bad("diagnoses since a date", "GET", "/v1/diagnoses", {"since": "2024-01-01"}),
    *(
        Bad(f"{path} cursor {label}", "GET", path, {"cursor": cursor})
        for path in ("/v1/jobs", "/v1/diagnoses", "/v1/jobs/seed/diagnoses")
        for label, cursor in [
            ("not base64", "!!"),
            ("garbage", _cursor("x|y")),
            ("naive time", _cursor("2024-01-01T00:00:00|seed")),
            ("NUL id", _cursor("2024-01-01T00:00:00+00:00|a\x00b")),
            ("year 1 east", _cursor("0001-01-01T00:00:00+01:00|seed")),
        ]
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[bad.name for bad in BAD])
def test_bad_input_is_a_4xx_with_the_error_body(
    service: ServiceProcess, diagnosis_id: str, bad: Bad
) -> None:
    response = httpx.request(
        bad.method,
        service.base_url + bad.path.replace("{diagnosis}", diagnosis_id),
        params=bad.params,
        json=bad.json,
        content=bad.content,
        headers=bad.headers,
    )
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert isinstance(body["error"], str)
    assert isinstance(body["detail"], str)


def test_a_422_names_the_field_without_pydantic_internals(service: ServiceProcess) -> None:
    response = httpx.post(f"{service.base_url}{EVENTS}", json={"type": "started", "ts": False})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("body.ts: ")
    assert "function-" not in response.json()["detail"]


@pytest.mark.parametrize(
    ("stream", "node"), [("gpu-1/3", "gpu-1"), ("pod.ns:main@x_1", "gpu-1"), ("a..b/c", "c")]
)
def test_stream_ids_of_names_joined_by_slashes_are_accepted(
    service: ServiceProcess, stream: str, node: str
) -> None:
    response = httpx.post(
        f"{service.base_url}{LOGS}",
        params={"node": node, "stream": stream},
        content=b"step 1\n",
        headers=TEXT,
    )
    assert response.status_code == 200, response.text
    assert response.json()["stream"] == stream


def test_ranks_as_json_numbers_and_digit_text_are_accepted(service: ServiceProcess) -> None:
    records: list[dict[str, Any]] = [
        {"line": "a", "rank": 3},
        {"line": "b", "rank": 4.0},
        {"line": "c", "rank": "5"},
    ]
    body = b"".join(_ndjson(record) for record in records)
    response = httpx.post(
        f"{service.base_url}/v1/jobs/ranks/logs", params={"node": "n"}, content=body, headers=NDJSON
    )
    assert response.status_code == 200, response.text
    job = httpx.get(f"{service.base_url}/v1/jobs/ranks").json()
    assert job["ranks"] == [3, 4, 5]
    event = httpx.post(
        f"{service.base_url}/v1/jobs/ranks/events",
        json={"type": "exited", "rank": 9_999_999, "exit_code": 137.0, "signal": 9},
    )
    assert event.status_code == 201, event.text
    assert (event.json()["rank"], event.json()["signal"]) == (9_999_999, "SIGKILL")


def test_every_cursor_the_api_hands_out_is_accepted(service: ServiceProcess) -> None:
    for job in ("page-a", "page-b", "page-c"):
        httpx.post(
            f"{service.base_url}/v1/jobs/{job}/logs",
            params={"node": "n"},
            content=OOM,
            headers=TEXT,
        )
    for path, key in (("/v1/jobs", "jobs"), ("/v1/diagnoses", "diagnoses")):
        seen: list[str] = []
        cursor = ""  # empty: the first page
        while cursor is not None:
            page = httpx.get(f"{service.base_url}{path}", params={"limit": 1, "cursor": cursor})
            assert page.status_code == 200, page.text
            seen += [row["id"] for row in page.json()[key]]
            cursor = page.json()["next_cursor"]
        assert len(seen) == len(set(seen)) >= 3


def test_since_takes_rfc3339_with_or_without_a_zone(service: ServiceProcess) -> None:
    for since in ("2020-01-01T00:00:00Z", "2020-01-01T00:00:00", "2020-01-01T01:00:00+01:00"):
        response = httpx.get(f"{service.base_url}/v1/diagnoses", params={"since": since})
        assert response.status_code == 200, response.text
