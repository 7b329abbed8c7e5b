"""`diagnoser run`: the training command's output shipped, its lifecycle posted, its status kept.

Each test runs the real CLI in a subprocess against a real service over HTTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import servers
from tests.conftest import run_service
from tests.servers import ServiceProcess, free_port

STEPS = "for i in range(1, 6): print(f'iteration {i}/100 | lm loss: 2.41', flush=True)\n"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    yield from run_service(
        {
            "DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data")),
            "DIAGNOSER_HANG__TIMEOUT_S": "2",
            "DIAGNOSER_HANG__CHECK_INTERVAL_S": "0.2",
        }
    )


def run_diagnoser(*args: str) -> subprocess.CompletedProcess[str]:
    """`diagnoser run` as a pod runs it: a child process (it owns signals and fds 1 and 2)."""
    return servers.run_diagnoser(*args, child=True)


def wrapper(service_url: str, job: str, log: Path, *extra: str) -> list[str]:
    return [
        "run", "--server", service_url, "--job", job, "--node", "node-0", "--log", str(log),
        "--heartbeat-seconds", "1", *extra, "--",
    ]  # fmt: skip


def exits(service: ServiceProcess, name: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = httpx.get(f"{service.base_url}/v1/jobs/{name}").json()["exits"]
    return found


def lines_received(service: ServiceProcess, name: str) -> int:
    return int(httpx.get(f"{service.base_url}/v1/jobs/{name}").json()["lines_received"])


def test_output_is_shipped_and_copied_and_the_exit_code_kept(
    service: ServiceProcess, tmp_path: Path
) -> None:
    log = tmp_path / "out.log"
    script = STEPS + "import sys; print('done', file=sys.stderr); sys.exit(3)"
    result = run_diagnoser(*wrapper(service.base_url, "exit-3", log), sys.executable, "-c", script)
    assert result.returncode == 3, result.stderr
    assert result.stdout.count("iteration") == 5
    assert "done" in result.stdout  # stderr joins stdout, as a pod log shows it
    assert log.read_text().count("\n") == 6
    assert lines_received(service, "exit-3") == 6
    assert [(e["type"], e["node"], e["exit_code"]) for e in exits(service, "exit-3")] == [
        ("exited", "node-0", 3)
    ]


def test_a_command_that_stops_progressing_is_diagnosed_as_a_hang_while_it_runs(
    service: ServiceProcess, tmp_path: Path
) -> None:
    script = STEPS + "import time; time.sleep(8)"
    argv = [
        sys.executable, "-m", "diagnoser", *wrapper(service.base_url, "sleepy", tmp_path / "l"),
        sys.executable, "-c", script,
    ]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        deadline = time.monotonic() + 30
        found: list[dict[str, object]] = []
        while not found and time.monotonic() < deadline and process.poll() is None:
            found = httpx.get(f"{service.base_url}/v1/jobs/sleepy/diagnoses").json()["diagnoses"]
            time.sleep(0.2)
        assert process.poll() is None, "the hang was not seen while the command still ran"
        assert [(d["failure_type"], d["action"]) for d in found] == [("hang", "restart_job")]
        assert "after step 5" in str(found[0]["summary"])
        assert process.wait(30) == 0


def test_sigterm_reaches_the_command_and_its_signal_is_reported(
    service: ServiceProcess, tmp_path: Path
) -> None:
    script = "import time\nprint('ready', flush=True)\ntime.sleep(60)"
    argv = [
        sys.executable, "-m", "diagnoser", *wrapper(service.base_url, "stopped", tmp_path / "l"),
        sys.executable, "-c", script,
    ]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM
    assert [(e["exit_code"], e["signal"]) for e in exits(service, "stopped")] == [(None, "SIGTERM")]


def test_an_unreachable_service_never_stops_the_training(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    script = STEPS + "import sys; sys.exit(0)"
    result = run_diagnoser(
        *wrapper(down, "offline", tmp_path / "out.log", "--drain-seconds", "1"),
        sys.executable, "-c", script,
    )  # fmt: skip
    assert result.returncode == 0
    assert result.stdout.count("iteration") == 5
    assert (tmp_path / "out.log").read_text().count("iteration") == 5
    assert "could not post `started`" in result.stderr


def test_a_new_log_file_after_an_earlier_attempt_loses_no_line(
    service: ServiceProcess, tmp_path: Path
) -> None:
    script = "for i in range(20000): print(f'iteration {i} | lm loss: 2.41', flush=(i % 500 == 0))"
    for attempt in ("first", "second"):
        result = run_diagnoser(
            *wrapper(service.base_url, "two-attempts", tmp_path / f"{attempt}.log"),
            sys.executable, "-c", script,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    assert lines_received(service, "two-attempts") == 40000


def test_a_process_left_holding_the_output_does_not_hold_the_wrapper(
    service: ServiceProcess, tmp_path: Path
) -> None:
    script = "import subprocess; print(subprocess.Popen(['sleep', '60']).pid, flush=True)"
    result = run_diagnoser(
        *wrapper(service.base_url, "leftover", tmp_path / "out.log"), sys.executable, "-c", script
    )
    leftover = int(result.stdout.split()[0])
    try:
        assert result.returncode == 0, result.stderr
        os.kill(leftover, 0)  # still alive: the wrapper returned without waiting for it
        assert [(e["type"], e["exit_code"]) for e in exits(service, "leftover")] == [("exited", 0)]
    finally:
        os.kill(leftover, signal.SIGKILL)
