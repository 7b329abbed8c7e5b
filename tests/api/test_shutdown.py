"""SIGTERM stops `diagnoser serve` cleanly, and the rule watcher does not hold the shutdown.

The watcher waits for file changes in a thread that looks at cancellation only every few
seconds; it must be told to stop instead (bench/shutdown.py measures the difference).
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio

from diagnoser.config import SOURCE_RULES_DIR
from diagnoser.reload import RuleReloader
from diagnoser.rules import RuleRegistry
from tests.servers import ServiceProcess


def test_sigterm_stops_serve_with_status_0_after_the_watcher_stopped(tmp_path: Path) -> None:
    service = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)})
    service.start()
    process = service.process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    log = service.log.read_text()
    # Ended by its stop event during the lifespan shutdown, not cancelled after it.
    assert log.index("rule watcher stopped") < log.index("Application shutdown complete")


async def test_the_watch_returns_by_itself_once_told_to_stop(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    for pack in SOURCE_RULES_DIR.glob("*.yaml"):
        (rules / pack.name).write_bytes(pack.read_bytes())
    reloader = RuleReloader(RuleRegistry(rules))
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reloader.watch, stop)
        await anyio.sleep(0.2)  # let it block in its thread
        stop.set()
    # Leaving the task group means watch() returned: nothing cancelled it.
