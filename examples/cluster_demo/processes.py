"""Child processes of the demo (the service, the ranks, the operator) and their output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LineSink = Callable[[str, str], None]
"""Called with (who, line) for every line a child prints."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def clean_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without its DIAGNOSER_* settings, plus the demo's own.

    A DIAGNOSER_DB__URL or DIAGNOSER_LLM__BASE_URL of the person running the demo must not
    point the throwaway service at a real database or model.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("DIAGNOSER_")}
    env.update(extra)
    return env


def diagnoser_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "diagnoser", *args]


@dataclass
class Child:
    """One child process whose merged output is read line by line."""

    who: str
    command: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    sink: LineSink | None = None
    log: Path | None = None
    """Where the output goes instead of the sink (the service's access log is noise)."""
    process: asyncio.subprocess.Process | None = None
    _pump: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        if self.log is not None:
            with self.log.open("ab") as out:
                self.process = await asyncio.create_subprocess_exec(
                    *self.command, env=dict(self.env), cwd=self.cwd, stdout=out,
                    stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
            return
        self.process = await asyncio.create_subprocess_exec(
            *self.command, env=dict(self.env), cwd=self.cwd, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            if self.sink is not None:
                self.sink(self.who, raw.decode(errors="replace").rstrip("\r\n"))

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._pump is not None:
            await self._pump
        return code

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after the grace period; a process already gone is fine."""
        if self.process is None or self.process.returncode is not None:
            if self._pump is not None:
                await self._pump
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.wait()

    def log_tail(self, chars: int = 2000) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-chars:]


async def wait_healthy(service: Child, base_url: str, timeout_s: float) -> None:
    """Until `GET /healthz` answers 200; a service that exits first fails with its log tail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=1) as http:
        while True:
            if service.returncode is not None:
                raise RuntimeError(f"diagnoser serve exited: {service.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{base_url}/healthz")).status_code == 200:
                    return
            if loop.time() > deadline:
                raise TimeoutError(f"diagnoser serve not up after {timeout_s:g} s")
            await asyncio.sleep(0.1)
