"""The published OpenAPI document against a real `diagnoser serve`: a bounded schemathesis run.

Every operation gets a fixed number of generated requests (valid and invalid); any 5xx, an
undocumented status code, or a body, content type or header that the document does not allow
fails the test. Generation is deterministic, so a failure here reproduces on every run. The run
authenticates with an admin token, which every route allows.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import Case, SerializationContext
from schemathesis.config import SchemathesisConfig
from schemathesis.schemas import BaseSchema

from diagnoser.app import create_app
from diagnoser.config import Settings
from diagnoser.store.cursor import encode_cursor
from tests.auth.issuing import Token, create_token
from tests.conftest import run_service
from tests.servers import ServiceProcess

MAX_EXAMPLES = 25
"""Per operation and phase; the whole run stays around half a minute on this machine."""
OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


@schemathesis.serializer("application/x-ndjson")
def _ndjson(_: SerializationContext, value: Any) -> bytes:
    """The document describes an NDJSON body as its records; on the wire, one per line."""
    if isinstance(value, list):
        return b"".join(json.dumps(item).encode() + b"\n" for item in value)
    return json.dumps(value).encode()


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Token]:
    data_dir = tmp_path_factory.mktemp("data")
    return data_dir, create_token(data_dir, "admin")


@pytest.fixture(scope="module")
def service(admin: tuple[Path, Token]) -> Iterator[ServiceProcess]:
    data_dir, token = admin
    env = {
        "DIAGNOSER_DATA_DIR": str(data_dir),
        "DIAGNOSER_INGEST__IDLE_TIMEOUT_S": "5",
        # A claim may long-poll up to 30 s; here it answers at once (its own tests wait).
        "DIAGNOSER_ACTIONS__CLAIM_MAX_WAIT_S": "0",
    }
    for service in run_service(env):
        _seed(service, token)
        yield service


def _seed(service: ServiceProcess, token: Token) -> None:
    """Two jobs with a diagnosis each, so that lists have rows to page through."""
    for job in ("seed-a", "seed-b"):
        response = httpx.post(
            f"{service.base_url}/v1/jobs/{job}/logs",
            params={"node": "gpu-1"},
            content=OOM,
            headers={"Content-Type": "text/plain", **token.headers},
        )
        assert response.status_code == 200, response.text


def _api_schema() -> BaseSchema:
    """The document the service publishes (the app builds it without starting up)."""
    document = copy.deepcopy(create_app(Settings(rules_watch=False)).openapi())
    # Every call carries an admin token (tests/auth/ covers what a missing one answers), so
    # the run does not generate requests without it.
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.pop("security", None)
    config = SchemathesisConfig.from_dict(
        {
            "seed": 20261201,
            "generation": {
                "deterministic": True,
                "max-examples": MAX_EXAMPLES,
                "database": "none",
            },
            # Generation is deterministic; only its speed depends on how busy the machine is.
            "suppress-health-check": ["too_slow"],
            "phases": {"stateful": {"enabled": False}},
            # A well-formed cursor must be accepted; forged ones are tested in
            # test_validation.py (no pattern tells them apart from real ones).
            "parameters": {"query.cursor": encode_cursor(datetime(2030, 1, 1, tzinfo=UTC), "z")},
            "request-timeout": 10,
        }
    )
    schema = schemathesis.openapi.from_dict(document, config=config)
    # Endless event streams: they have their own tests (tests/api/test_diagnoses.py,
    # tests/api/test_actions.py).
    return schema.exclude(path="/v1/diagnoses/stream").exclude(path="/v1/actions/stream")


schema = _api_schema()


@schema.parametrize()
def test_every_operation_answers_as_its_schema_says(
    case: Case[Any], service: ServiceProcess, admin: tuple[Path, Token]
) -> None:
    case.call_and_validate(base_url=service.base_url, headers=admin[1].headers)


def test_the_served_document_is_the_one_tested(service: ServiceProcess) -> None:
    served = httpx.get(f"{service.base_url}/openapi.json").json()
    assert served == create_app(Settings(rules_watch=False)).openapi()


def test_the_run_covers_the_log_upload_bodies() -> None:
    """The upload route declares its bodies, so the run above sends text, NDJSON and JSON."""
    operation = schema["/v1/jobs/{job_id}/logs"]["POST"]
    media_types = {body.media_type for body in operation.body}
    assert media_types >= {"text/plain", "application/x-ndjson", "application/json"}
