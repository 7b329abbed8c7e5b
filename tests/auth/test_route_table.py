"""Every route of the app x every role, generated from `app.routes`: a route that the route ->
role table (diagnoser/auth/roles.py) does not name fails here, and so does any answer that the
table does not predict (401 without a valid token, 403 for a role it does not list)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

from diagnoser.app import create_app
from diagnoser.auth.roles import POLICY, Open, access_for
from diagnoser.auth.tokens import Role
from diagnoser.config import Settings
from tests.auth.issuing import Token, create_token
from tests.servers import ServiceProcess

SAMPLES = {
    "job_id": "train-1",
    "node": "node-a",
    "diagnosis_id": "3f7c9a4e-1b2d-4c5e-8f90-123456789abc",
    "filter_id": "1",
    "suggestion_id": "0123456789ab",
    "token_id": "0123456789ab",
    "action_id": "1",
    "path": "favicon.png",
}
"""A value for every path parameter a route may have (a missing one fails the test)."""


def _flat(routes: list[Any]) -> Iterator[Any]:
    """Routes with their full paths; FastAPI keeps an included router as one entry that
    resolves its routes lazily (`effective_route_contexts`)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            yield from contexts()
        else:
            yield route


def _operations() -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves."""
    operations: list[tuple[str, str]] = []
    for route in _flat(create_app(Settings(rules_watch=False)).routes):
        if isinstance(route, Mount):
            operations.append(("GET", route.path))
        else:
            methods = sorted(set(route.methods or ()) - {"HEAD"})
            assert methods, f"a route without methods: {route!r}"
            operations.extend((method, route.path) for method in methods)
    return operations


OPERATIONS = _operations()
CALLERS = ["no token", "malformed token", *Role]
QUERY = {"node": "node-a"}
"""The one required query parameter (the log routes'); other routes ignore it."""


def test_every_route_has_an_access_rule() -> None:
    missing = [
        f"{method} {path}" for method, path in OPERATIONS if access_for(method, path) is None
    ]
    assert missing == [], "add these to diagnoser/auth/roles.py POLICY"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Token]:
    data_dir = tmp_path_factory.mktemp("table")
    return {role.value: create_token(data_dir, role.value) for role in Role} | {
        "data_dir": Token("", str(data_dir))
    }


@pytest.fixture(scope="module")
def service(tokens: dict[str, Token]) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": tokens["data_dir"].raw})
    process.start()
    yield process
    process.stop()


def _url(base_url: str, path: str) -> str:
    concrete = path
    for name, value in SAMPLES.items():
        for converter in ("", ":path", ":int"):
            concrete = concrete.replace("{" + name + converter + "}", value)
    assert "{" not in concrete, f"no sample value for a parameter of {path}"
    if concrete == "/static-offline-docs":
        concrete += "/favicon.png"
    return f"{base_url}{concrete}"


def _expected(method: str, path: str, caller: str) -> str:
    access = access_for(method, path)
    assert access is not None
    if access.open is not None and access.open in (Open.ALWAYS, Open.HEALTH, Open.METRICS):
        return "allowed"  # open by default (DIAGNOSER_AUTH__OPEN_* settings)
    if caller in ("no token", "malformed token"):
        return "401"
    return "allowed" if Role(caller) in access.roles else "403"


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_route_answers_as_the_table_says(
    service: ServiceProcess, tokens: dict[str, Token], method: str, path: str, caller: str
) -> None:
    headers = {"Content-Type": "application/json"}
    if caller == "malformed token":
        headers["Authorization"] = "Bearer not-a-token"
    elif caller in tokens:
        headers |= tokens[caller].headers
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            method,
            _url(service.base_url, path),
            params={"node": "node-a"},
            headers=headers,
            content=b"",
        ) as response,
    ):
        status = response.status_code  # an event stream is left once its status is known
    expected = _expected(method, path, caller)
    if expected == "allowed":
        assert status not in (401, 403), f"{caller} {method} {path}: {status}"
        assert status < 500
    else:
        assert status == int(expected), f"{caller} {method} {path}: {status}"


def test_docs_page_and_its_assets_need_no_token(service: ServiceProcess) -> None:
    """The API description is public: the code it describes is."""
    page = httpx.get(f"{service.base_url}/docs")
    assert page.status_code == 200
    asset = httpx.get(f"{service.base_url}/static-offline-docs/swagger-ui.css")
    assert asset.status_code == 200


def test_an_unknown_token_and_a_wrong_role_answer_clear_json(
    service: ServiceProcess, tokens: dict[str, Token]
) -> None:
    forged = tokens["admin"].raw[:-4] + "AAAA"
    unknown = httpx.get(
        f"{service.base_url}/v1/jobs", headers={"Authorization": f"Bearer {forged}"}
    )
    assert unknown.status_code == 401
    assert unknown.headers["www-authenticate"] == "Bearer"
    assert unknown.json() == {"error": "unauthorized", "detail": "unknown bearer token"}
    wrong = httpx.get(f"{service.base_url}/v1/jobs", headers=tokens["ingest"].headers)
    assert wrong.status_code == 403
    assert wrong.json()["error"] == "forbidden"
    assert "role ingest may not GET /v1/jobs" in wrong.json()["detail"]


def test_the_sample_values_cover_every_parameter() -> None:
    for _, path in OPERATIONS:
        _url("http://service", path)


def test_the_table_names_no_route_that_does_not_exist() -> None:
    """Only the recovery-actions routes (issue 14, built on another branch) may come ahead."""
    ahead = {key for key in POLICY if key not in set(OPERATIONS)}
    assert all(path.startswith("/v1/actions") or path.endswith("/opt-out") for _, path in ahead)
