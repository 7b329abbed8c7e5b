"""Request caps, each a clear JSON error, against the real service (docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnoser.api.limits import json_shape_problem
from tests.servers import ServiceProcess


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = ServiceProcess(
        env={
            "DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("limits")),
            "DIAGNOSER_LIMITS__MAX_BODY_BYTES": "4096",
            "DIAGNOSER_LIMITS__MAX_JSON_ITEMS": "100",
        }
    )
    process.start()
    yield process
    process.stop()


def _error(response: httpx.Response, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error
    detail: str = body["detail"]
    return detail


def test_a_large_body_is_413(service: ServiceProcess) -> None:
    response = httpx.put(f"{service.base_url}/v1/jobs/j1", json={"family": "x" * 5000})
    assert "limited to 4096 bytes" in _error(response, 413, "payload_too_large")


def test_deep_json_is_400_and_a_long_array_413(service: ServiceProcess) -> None:
    deep = "[" * 100 + "]" * 100
    response = httpx.post(
        f"{service.base_url}/v1/jobs/j1/events",
        content=deep.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert "nested deeper than 32" in _error(response, 400, "bad_request")
    wide = json.dumps({"type": "started", "x": list(range(200))})
    response = httpx.post(
        f"{service.base_url}/v1/jobs/j1/events",
        content=wide.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert "more than 100 members" in _error(response, 413, "payload_too_large")


def test_large_headers_are_431_and_a_long_query_414(service: ServiceProcess) -> None:
    response = httpx.get(f"{service.base_url}/v1/jobs", headers={"X-Pad": "x" * 20_000})
    _error(response, 431, "request_header_fields_too_large")
    response = httpx.get(f"{service.base_url}/v1/jobs", params={"pad": "x" * 5000})
    _error(response, 414, "uri_too_long")


def test_the_log_upload_streams_past_the_body_cap(service: ServiceProcess) -> None:
    text = b"step 1 loss 2.5\n" * 1000  # 16 KB, four times MAX_BODY_BYTES
    response = httpx.post(
        f"{service.base_url}/v1/jobs/j2/logs",
        params={"node": "n1"},
        content=text,
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["lines_accepted"] == 1000


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{},"\\ab', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=30,
)


def _shape(value: object, depth: int = 0) -> tuple[int, int]:
    """(depth, widest container) of a JSON value, the reference for the byte scanner."""
    if isinstance(value, list | dict):
        children = list(value.values()) if isinstance(value, dict) else value
        inner = [_shape(child, depth + 1) for child in children]
        return max([depth + 1, *(d for d, _ in inner)]), max(
            [len(children), *(w for _, w in inner)]
        )
    return depth, 0


@settings(max_examples=200, deadline=None)
@given(value=JSON, max_depth=st.integers(2, 6), max_items=st.integers(1, 6))
def test_the_byte_scanner_agrees_with_the_parsed_shape(
    value: object, max_depth: int, max_items: int
) -> None:
    depth, widest = _shape(value)
    problem = json_shape_problem(json.dumps(value).encode(), max_depth, max_items)
    if depth > max_depth:
        assert problem is not None
    elif widest > max_items:
        assert problem is not None
        assert "members" in problem
    else:
        assert problem is None
