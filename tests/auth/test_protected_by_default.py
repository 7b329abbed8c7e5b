"""Protected by default, with the real `diagnoser serve`: open only on loopback and only while
no token exists; refused, with one line, anywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.auth.issuing import create_token
from tests.servers import ServiceProcess, free_port, run_diagnoser, wait_until


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def serve(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = run_diagnoser(
        "serve", "--data-dir", str(data_dir), "--port", str(free_port()), *args,
        env={"COLUMNS": "200", **(env or {})}, timeout=60, child=True,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    return one_error_line(result.stderr)


def test_no_token_and_a_public_address_refuses_to_start(tmp_path: Path) -> None:
    line = serve(tmp_path, "--host", "0.0.0.0")
    assert line == (
        "error: no API token exists and the service would listen on 0.0.0.0: create one with "
        "`diagnoser token create --role admin` (same database settings)"
    )


def test_enabled_true_needs_a_token_even_on_loopback(tmp_path: Path) -> None:
    line = serve(tmp_path, env={"DIAGNOSER_AUTH__ENABLED": "true"})
    assert line.startswith("error: no API token exists: create one with `diagnoser token create")


def test_enabled_false_is_refused_off_loopback(tmp_path: Path) -> None:
    line = serve(tmp_path, "--host", "0.0.0.0", env={"DIAGNOSER_AUTH__ENABLED": "false"})
    assert "accepted on loopback only, not on 0.0.0.0" in line


@pytest.fixture
def open_service(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)})
    process.start()
    yield process
    process.stop()


def test_no_token_on_loopback_runs_open_and_says_so(open_service: ServiceProcess) -> None:
    assert httpx.get(f"{open_service.base_url}/v1/jobs").status_code == 200
    assert "AUTHENTICATION IS OFF" in open_service.log.read_text()


def test_the_first_token_turns_protection_on_without_a_restart(
    open_service: ServiceProcess, tmp_path: Path
) -> None:
    token = create_token(tmp_path, "read")
    url = f"{open_service.base_url}/v1/jobs"
    wait_until(lambda: httpx.get(url).status_code == 401, 10, "protection")
    assert httpx.get(url, headers=token.headers).status_code == 200
    assert httpx.get(f"{open_service.base_url}/healthz").status_code == 200  # open by setting


def test_with_a_token_a_public_address_starts_protected(tmp_path: Path) -> None:
    token = create_token(tmp_path, "read")
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)})
    process.start("--host", "0.0.0.0")
    try:
        url = f"{process.base_url}/v1/jobs"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers=token.headers).status_code == 200
        assert "AUTHENTICATION IS OFF" not in process.log.read_text()
    finally:
        process.stop()


def test_probes_and_metrics_can_be_closed(tmp_path: Path) -> None:
    token = create_token(tmp_path, "read")
    process = ServiceProcess(
        env={
            "DIAGNOSER_DATA_DIR": str(tmp_path),
            "DIAGNOSER_AUTH__OPEN_HEALTH": "false",
            "DIAGNOSER_AUTH__OPEN_METRICS": "false",
        },
        probe_headers=token.headers,
    )
    process.start()
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert httpx.get(f"{process.base_url}{path}").status_code == 401
            assert httpx.get(f"{process.base_url}{path}", headers=token.headers).status_code == 200
    finally:
        process.stop()
