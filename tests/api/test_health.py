"""The service as an operator meets it: `diagnoser serve` over real HTTP, real databases."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import PostgresServer, ServiceProcess, wait_until


@pytest.fixture
def embedded_service(tmp_path: Path) -> Iterator[ServiceProcess]:
    service = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path / "data")})
    service.start()
    yield service
    service.stop()


def readiness(service: ServiceProcess) -> httpx.Response:
    return httpx.get(f"{service.base_url}/readyz", timeout=10)


def test_embedded_default_is_ready_and_writes_its_sqlite_file(
    embedded_service: ServiceProcess, tmp_path: Path
) -> None:
    assert httpx.get(f"{embedded_service.base_url}/healthz").json()["status"] == "ok"
    ready = readiness(embedded_service)
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok"}}
    assert (tmp_path / "data" / "diagnoser.db").stat().st_size > 0


def test_openapi_page_and_metrics_are_served(embedded_service: ServiceProcess) -> None:
    docs = httpx.get(f"{embedded_service.base_url}/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()
    assert httpx.get(f"{embedded_service.base_url}/openapi.json").json()["info"]["title"] == (
        "diagnoser"
    )
    httpx.get(f"{embedded_service.base_url}/healthz")
    metrics = httpx.get(f"{embedded_service.base_url}/metrics").text
    assert 'diagnoser_http_requests_total{method="GET",route="/healthz",status="200"}' in metrics


def migrate(database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", "migrate", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_postgres_readiness_follows_the_server_without_a_restart(tmp_path: Path) -> None:
    postgres = PostgresServer()
    postgres.init()
    postgres.start()
    service = ServiceProcess(
        env={"DIAGNOSER_DATA_DIR": str(tmp_path), "DIAGNOSER_DB__CONNECT_TIMEOUT_S": "1"}
    )
    try:
        service.start("--database-url", postgres.url())
        not_migrated = readiness(service)
        assert not_migrated.status_code == 503
        assert "run `diagnoser migrate`" in not_migrated.json()["checks"]["database"]

        assert migrate(postgres.url()).returncode == 0
        assert readiness(service).status_code == 200

        postgres.stop()
        down = readiness(service)
        assert down.status_code == 503
        assert down.json()["checks"]["database"].startswith("database unreachable")

        postgres.start()
        wait_until(lambda: readiness(service).status_code == 200, 20, "readiness after restart")
        assert not (tmp_path / "diagnoser.db").exists()  # PostgreSQL, not the embedded file
    finally:
        service.stop()
        postgres.destroy()
