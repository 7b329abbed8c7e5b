"""Settings that name features not built yet fail loudly; the CLI says how auth works."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServiceProcess, run_diagnoser


def diagnoser(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_diagnoser(*args, env={"COLUMNS": "200", **(env or {})}, timeout=60)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def flat(text: str) -> str:
    """Help text without rich's box borders and line wrapping."""
    return re.sub(r"[\s│]+", " ", text)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DIAGNOSER_AUTH__ENABLED", "false"),
        ("DIAGNOSER_ACTIONS__DRY_RUN", "true"),
        ("DIAGNOSER_ACTIONS__DRY_RUN", "false"),
    ],
)
def test_a_setting_that_states_what_happens_anyway_is_accepted(variable: str, value: str) -> None:
    result = diagnoser("rules", "check", env={variable: value})
    assert result.returncode == 0, result.stderr


def test_serve_help_says_when_the_service_is_open() -> None:
    result = diagnoser("serve", "--help")
    assert result.returncode == 0
    assert "With none, the service runs open on loopback only" in flat(result.stdout)


@pytest.mark.parametrize("command", ["ship", "run"])
def test_token_help_says_which_token_to_use(command: str) -> None:
    result = diagnoser(command, "--help")
    assert result.returncode == 0
    assert "an ingest token from `diagnoser token create --role ingest`" in flat(result.stdout)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path / "data")})
    process.start()
    yield process
    process.stop()


def test_an_open_service_on_loopback_takes_any_token(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """No token exists yet, so none is checked (tests/auth/ covers the protected service)."""
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.5\nstep 2 loss 2.4\n")
    result = diagnoser("ship", str(log), "--server", service.base_url, "--job", "j1",
                       "--node", "n1", "--token", "anything")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "2 lines accepted" in result.stderr
