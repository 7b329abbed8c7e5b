"""Time from SIGTERM to exit of `diagnoser serve`, with the rule watcher on and off.

    python bench/shutdown.py               # 5 stops each, ~1 minute
    python bench/shutdown.py --runs 10

Each run starts a fresh `diagnoser serve` (temp data dir, embedded SQLite), waits for
`/healthz`, sends SIGTERM and times the exit. The peer is the same server with
`DIAGNOSER_RULES_WATCH=false`: what shutdown costs without the watcher at all.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from processes import free_port, wait_for_health


def stop_seconds(watch: bool) -> tuple[float, int]:
    """One start and SIGTERM; the seconds until the process is gone, and its exit status."""
    with tempfile.TemporaryDirectory() as data:
        log = Path(data) / "serve.log"
        port = free_port()
        env = {
            **os.environ,
            "DIAGNOSER_DATA_DIR": data,
            "DIAGNOSER_RULES_WATCH": "true" if watch else "false",
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "diagnoser", "serve", "--port", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for_health(process, f"http://127.0.0.1:{port}", log, 60)
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        status = process.wait(60)
        return time.perf_counter() - started, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for watch in (True, False):
        results = [stop_seconds(watch) for _ in range(args.runs)]
        times = [seconds for seconds, _ in results]
        rows.append((watch, statistics.median(times), max(times), {s for _, s in results}))
    peer = rows[1][1]
    print("| rule watcher | median s | max s | exit status | vs no watcher |")
    print("|---|---:|---:|---|---:|")
    for watch, median, worst, statuses in rows:
        label = "on (default)" if watch else "off (peer)"
        codes = ", ".join(str(s) for s in sorted(statuses))
        print(f"| {label} | {median:.2f} | {worst:.2f} | {codes} | {median / peer:.2f}x |")


if __name__ == "__main__":
    main()
