"""The suite's own process harness: what makes a flaky start a clear, fast failure or a retry."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.servers import ServerExitedError, ServiceProcess, wait_until


def test_a_port_taken_since_it_was_chosen_moves_the_service_to_a_fresh_one(
    tmp_path: Path,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        service = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)}, port=taken)
        service.start()
        try:
            assert service.port != taken
            assert "already in use" in service.log.read_text()
        finally:
            service.stop()


def test_a_process_that_exited_ends_the_wait_at_once() -> None:
    calls = 0

    def exited() -> bool:
        nonlocal calls
        calls += 1
        raise ServerExitedError("server exited: boom")

    with pytest.raises(ServerExitedError, match="boom"):
        wait_until(exited, 60, "a server")
    assert calls == 1, "no polling once the process is gone"
