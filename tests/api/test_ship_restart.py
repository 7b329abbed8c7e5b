"""The issue's acceptance test: kill the server while `diagnoser ship` streams a million lines."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.servers import ServiceProcess, wait_until

LINES = 1_000_000


def committed_lines(service: ServiceProcess) -> int:
    response = httpx.get(
        f"{service.base_url}/v1/jobs/big/logs", params={"node": "gpu-1", "rank": 0}, timeout=5
    )
    return int(response.json()["lines"]) if response.status_code == 200 else 0


def test_kill_and_restart_while_shipping_loses_and_doubles_nothing(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    with log.open("w") as out:
        for step in range(LINES):
            out.write(f"[rank0]: iteration {step:>7} | loss {2.5 - step * 1e-6:.6f} | lr 3.0e-4\n")
    service = ServiceProcess(
        env={
            "DIAGNOSER_DATA_DIR": str(tmp_path / "data"),
            "DIAGNOSER_INGEST__COMMIT_EVERY_S": "0.2",
        }
    )
    service.start()
    shipper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diagnoser",
            "ship",
            str(log),
            "--server",
            service.base_url,
            "--job",
            "big",
            "--node",
            "gpu-1",
            "--rank",
            "0",
            "--max-request-mib",
            "4",
            "--start-timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(2):  # two crashes at different points of the upload
            wait_until(lambda: committed_lines(service) > 100_000, 120, "upload progress")
            service.stop(signal.SIGKILL)
            time.sleep(0.5)
            service.start()
        output, _ = shipper.communicate(timeout=300)
        assert shipper.returncode == 0, output.decode()[-2000:]
        assert committed_lines(service) == LINES
        # Lines committed by the requests the crashes cut count too: the summary is the server's.
        assert f"{LINES} lines accepted" in output.decode()
        status = httpx.get(
            f"{service.base_url}/v1/jobs/big/logs", params={"node": "gpu-1", "rank": 0}
        ).json()
        assert status["committed_offset"] == log.stat().st_size
    finally:
        shipper.kill()
        service.stop()
