"""The benchmarks' server processes: starting them, and what /proc says about them (Linux)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine_busy_ticks() -> int:
    """Clock ticks all cores spent on anything but idle and I/O wait (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values[:8]) - values[3] - values[4]


def machine_busy_seconds() -> float:
    return machine_busy_ticks() / TICKS


def wait_for_health(
    process: subprocess.Popen[bytes], base_url: str, log: Path, timeout_s: float
) -> None:
    """Until `GET /healthz` answers 200; a server that exits first fails with its log tail."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not up after {timeout_s:g} s")
        time.sleep(0.05)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value at `fraction` of the sorted samples (nearest index); NaN without samples."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@contextlib.contextmanager
def serve(
    data: Path, settings: Mapping[str, str], database_url: str | None, timeout_s: float
) -> Iterator[str]:
    """`diagnoser serve` on a free port with only `settings` (the caller's DIAGNOSER_* are
    dropped), data under `data`, on SQLite or `database_url`; yields its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env |= {"DIAGNOSER_DATA_DIR": str(data), **settings}
    if database_url is not None:
        env["DIAGNOSER_DB__URL"] = database_url
    log = data / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, base_url, log, timeout_s=timeout_s)
        yield base_url
    finally:
        process.terminate()
        process.wait(30)


@contextlib.contextmanager
def throwaway_postgres(*, own_database: bool = False) -> Iterator[str | None]:
    """A throwaway PostgreSQL cluster's URL (its default database, or a fresh one with
    `own_database`), or None without the server binaries; the cluster is removed after."""
    from tests.servers import PostgresServer, find_postgres_bin

    if find_postgres_bin("initdb") is None or find_postgres_bin("pg_ctl") is None:
        yield None
        return
    server = PostgresServer()
    try:
        server.init()
        server.start()
        yield server.create_database() if own_database else server.url()
    finally:
        server.destroy()
