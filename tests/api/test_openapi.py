"""The OpenAPI document says what the service answers, and /docs works without the internet."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from diagnoser.app import create_app
from diagnoser.config import Settings
from tests.conftest import run_service
from tests.servers import ServiceProcess


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    yield from run_service({"DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data"))})


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings(rules_watch=False)).openapi()


def _statuses(document: dict[str, Any], method: str, path: str) -> set[str]:
    return set(document["paths"][path][method]["responses"])


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            yield method, path, operation


def test_every_422_is_documented_as_the_error_body_we_send(
    document: dict[str, Any], service: ServiceProcess
) -> None:
    documented = [
        operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
        for _, _, operation in _operations(document)
        if "422" in operation["responses"]
    ]
    assert len(documented) >= 10
    assert set(documented) <= {
        "#/components/schemas/ErrorBody",
        "#/components/schemas/RulesRejectedBody",
    }
    assert "HTTPValidationError" not in document["components"]["schemas"]
    error_body = document["components"]["schemas"]["ErrorBody"]
    assert set(error_body["required"]) == {"error", "detail"}
    answer = httpx.get(f"{service.base_url}/v1/jobs", params={"limit": 0})
    assert answer.status_code == 422
    assert set(answer.json()) == {"error", "detail"}


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        (
            "post",
            "/v1/jobs/{job_id}/logs",
            {"200", "408", "409", "413", "415", "422", "429", "503"},
        ),
        ("get", "/v1/jobs/{job_id}/logs", {"200", "404", "422"}),
        ("get", "/v1/jobs/{job_id}", {"200", "404", "422"}),
        ("put", "/v1/jobs/{job_id}", {"200", "400", "422"}),
        ("post", "/v1/jobs/{job_id}/events", {"201", "400", "422"}),
        ("get", "/v1/diagnoses/{diagnosis_id}", {"200", "404", "422"}),
        ("post", "/v1/diagnoses/{diagnosis_id}/feedback", {"201", "400", "404", "422"}),
        ("get", "/v1/nodes/{node}", {"200", "404", "422"}),
        ("post", "/v1/rules/reload", {"200", "422"}),
        ("post", "/v1/actions/claim", {"200", "400", "422"}),
        ("post", "/v1/actions/{action_id}/complete", {"200", "400", "404", "409", "422"}),
        ("post", "/v1/actions/{action_id}/extend", {"200", "400", "404", "409", "422"}),
        ("get", "/v1/actions", {"200", "422"}),
        ("get", "/v1/actions/{action_id}", {"200", "404", "422"}),
        ("put", "/v1/nodes/{node}/opt-out", {"200", "400", "422"}),
        ("delete", "/v1/jobs/{job_id}/opt-out", {"204", "404", "422"}),
        ("get", "/readyz", {"200", "503"}),
    ],
)
def test_every_status_a_route_answers_is_documented(
    document: dict[str, Any], method: str, path: str, statuses: set[str]
) -> None:
    protected = {"401", "403"} if path.startswith("/v1/") else set()  # docs/security.md
    assert _statuses(document, method, path) == statuses | protected


def test_error_answers_have_a_schema(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        for status, answer in operation["responses"].items():
            if status.startswith(("4", "5")):
                assert "schema" in answer["content"]["application/json"], (method, path, status)


def test_metrics_are_documented_as_text(document: dict[str, Any], service: ServiceProcess) -> None:
    content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]
    assert httpx.get(f"{service.base_url}/metrics").headers["content-type"].startswith("text/plain")


def test_the_log_upload_declares_its_bodies(document: dict[str, Any]) -> None:
    body = document["paths"]["/v1/jobs/{job_id}/logs"]["post"]["requestBody"]["content"]
    assert {"text/plain", "application/x-ndjson", "application/json"} <= set(body)
    record = body["application/json"]["schema"]["anyOf"][0]["items"]
    assert record["properties"]["node"]["anyOf"][0]["pattern"]


def test_a_405_allows_every_method_of_the_path(service: ServiceProcess) -> None:
    answer = httpx.request("DELETE", f"{service.base_url}/v1/jobs/j/logs", params={"node": "n"})
    assert answer.status_code == 405
    assert {"GET", "POST"} <= {m.strip() for m in answer.headers["allow"].split(",")}
    assert answer.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_only_assets_served_here(service: ServiceProcess, page: str) -> None:
    """An offline cluster has no CDN: every script, style and icon comes from the service."""
    html = httpx.get(f"{service.base_url}{page}")
    assert html.status_code == 200
    references = re.findall(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']""", html.text)
    references += re.findall(r"""(?:url|spec-url)\s*:\s*["']([^"']+)["']""", html.text)
    assert any(ref.endswith(".js") for ref in references), references
    for reference in references:
        url = urljoin(f"{service.base_url}{page}", reference)
        assert urlsplit(url).netloc == urlsplit(service.base_url).netloc, reference
        assert httpx.get(url).status_code == 200, reference
