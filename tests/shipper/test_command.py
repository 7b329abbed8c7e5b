"""`diagnoser ship` as an operator runs it: a child process, exit codes, one-line errors."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.servers import free_port, wait_until
from tests.shipper.conftest import LogServer
from tests.shipper.test_client import log_lines

SHIP = [sys.executable, "-m", "diagnoser", "ship"]


def ship(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SHIP, *args], input=stdin, capture_output=True, timeout=60, check=False)


def one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_ships_a_file_to_eof_and_exits_0(
    contract_server: LogServer, job: str, tmp_path: Path
) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(log_lines(0, 3000))
    result = ship(str(path), "--server", contract_server.url, "--job", job, "--node", "n1",
                  "--rank", "3")  # fmt: skip
    assert result.returncode == 0, result.stderr
    state = contract_server.state(job, "n1", rank=3)
    assert state is not None
    assert state.stream == "n1/3"
    assert (state.lines, state.committed_offset) == (3000, path.stat().st_size)
    summary = result.stderr.decode()
    assert "3000 lines accepted" in summary
    assert f"server offset {path.stat().st_size}" in summary


def test_ships_stdin(contract_server: LogServer, job: str) -> None:
    data = log_lines(0, 500)
    result = ship("-", "--server", contract_server.url, "--job", job, "--node", "n1", stdin=data)
    assert result.returncode == 0, result.stderr
    assert contract_server.contract is not None
    assert contract_server.contract.content(job, "n1") == data


def test_bad_token_exits_3_with_one_line(
    contract_server: LogServer, job: str, tmp_path: Path
) -> None:
    assert contract_server.contract is not None
    contract_server.contract.token = "s3cret"
    path = tmp_path / "train.log"
    path.write_bytes(b"hello\n")
    result = ship(str(path), "--server", contract_server.url, "--job", job, "--node", "n1",
                  "--token", "wrong")  # fmt: skip
    assert result.returncode == 3
    assert "authentication failed (401 unauthorized" in one_error_line(result)
    ok = ship(str(path), "--server", contract_server.url, "--job", job, "--node", "n1",
              "--token", "s3cret")  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_unparsable_url_exits_2_at_once(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"hello\n")
    for url in ("ftp://example.org", "no scheme", "http://"):
        result = ship(str(path), "--server", url, "--job", "j", "--node", "n1")
        assert result.returncode == 2, url
        assert "invalid --server URL" in one_error_line(result)


def test_unreachable_server_exits_2_after_the_start_timeout(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"hello\n")
    # Without the start timeout it would retry for ever: `ship` fails the test at its 60 s cap.
    result = ship(str(path), "--server", f"http://127.0.0.1:{free_port()}", "--job", "j",
                  "--node", "n1", "--start-timeout", "0.5")  # fmt: skip
    assert result.returncode == 2
    assert "cannot reach http://127.0.0.1:" in one_error_line(result)


def test_a_second_server_takes_the_stream_when_the_first_is_unreachable(
    contract_server: LogServer, job: str, tmp_path: Path
) -> None:
    """Replicas without a load balancer: `--server` repeated; a refused connection moves the
    stream to the next URL, which resumes it from the committed offset."""
    path = tmp_path / "train.log"
    path.write_bytes(log_lines(0, 1000))
    down = f"http://127.0.0.1:{free_port()}"
    result = ship(str(path), "--server", down, "--server", contract_server.url, "--job", job,
                  "--node", "n1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    state = contract_server.state(job, "n1")
    assert state is not None
    assert (state.lines, state.committed_offset) == (1000, path.stat().st_size)
    assert f"switching to {contract_server.url}" in result.stderr.decode()


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = ship(str(tmp_path / "nope.log"), "--server", "http://127.0.0.1:9", "--job", "j",
                  "--node", "n1")  # fmt: skip
    assert result.returncode == 2
    assert "no such file" in one_error_line(result)


def test_wrong_endpoint_exits_2(contract_server: LogServer, tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"hello\n")
    result = ship(str(path), "--server", f"{contract_server.url}/api", "--job", "j",
                  "--node", "n1")  # fmt: skip
    assert result.returncode == 2
    assert "no log endpoint at" in one_error_line(result)


def test_follow_finishes_the_in_flight_request_on_sigterm(
    contract_server: LogServer, job: str, tmp_path: Path
) -> None:
    assert contract_server.contract is not None
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    process = subprocess.Popen(
        [*SHIP, str(path), "--server", contract_server.url, "--job", job,
         "--node", "n1", "--follow", "--max-request-seconds", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        data = log_lines(0, 100)  # well under the contract server's commit step: only the
        with path.open("ab") as log:  # end of the request commits it
            log.write(data)
        wait_until(lambda: contract_server.contract is not None and contract_server.contract.busy,
                   20, "an upload in flight")  # fmt: skip
        assert contract_server.committed(job, "n1") == 0
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "100 lines accepted" in stderr.decode()
    assert contract_server.contract.content(job, "n1") == data
