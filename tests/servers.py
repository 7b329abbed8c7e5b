"""Real PostgreSQL, Redis and diagnoser processes for the suite, on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, cast

import click
import httpx
import psycopg
import pytest
import redis

REQUIRE_SERVICES = os.environ.get("CI") == "true" or os.environ.get(
    "DIAGNOSER_TEST_REQUIRE_SERVICES"
) in {"1", "true"}


def missing_service(message: str) -> NoReturn:
    """In CI a missing server fails the run; on a laptop it skips with the reason."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{message} (required because CI=true or DIAGNOSER_TEST_REQUIRE_SERVICES=1)")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


START_TIMEOUT_S = 120.0
"""How long `diagnoser serve` may take to answer: seconds alone, far more on a loaded machine."""


class ServerExitedError(RuntimeError):
    """The process being waited for is gone: waiting longer cannot help."""


def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except ServerExitedError:
            raise
        except Exception as exc:  # still starting
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} not up after {timeout}s (last error: {last!r})")


def find_postgres_bin(name: str) -> str | None:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else shutil.which(name)


@dataclass
class PostgresServer:
    """A throwaway cluster (initdb into a temp dir); run as `postgres` when we are root."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="diagnoser-pg-")))

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        initdb = find_postgres_bin("initdb")
        if initdb is None or find_postgres_bin("pg_ctl") is None:
            missing_service("PostgreSQL server binaries (initdb, pg_ctl) not found")
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(str(initdb), "-D", str(self.data_dir), "-U", "diagnoser", "--auth=trust",
                  "-E", "UTF8", "--no-sync")  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(str(find_postgres_bin("pg_ctl")), "-D", str(self.data_dir), "-o", options,
                  "-l", str(self.root / "server.log"), "-w", "start")  # fmt: skip

    def stop(self) -> None:
        self._run(str(find_postgres_bin("pg_ctl")), "-D", str(self.data_dir), "-m", "fast",
                  "-w", "stop")  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://diagnoser@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=diagnoser dbname=postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class RedisServer:
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing_service("redis-server not found")
        self.process = subprocess.Popen(
            [
                str(binary),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        wait_until(client.ping, 10, "redis-server")
        client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@dataclass
class ServiceProcess:
    """`diagnoser serve` as a user runs it: a child process, real uvicorn, real HTTP."""

    env: Mapping[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))
    probe_headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with the start probe (a token, when /healthz is closed)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra_args: str) -> None:
        """Start and wait for /healthz. A port another worker's test took since it was chosen
        (a restart reuses its port) is given up for a fresh one, once or twice."""
        for attempt in range(3):
            mark = self.log.stat().st_size if self.log.exists() else 0
            try:
                self._start(*extra_args)
                return
            except (RuntimeError, TimeoutError):
                taken = "already in use" in self.log.read_text(errors="replace")[mark:]
                if not taken or attempt == 2:
                    raise
                self.port = free_port()

    def _start(self, *extra_args: str) -> None:
        env = {**os.environ, **self.env}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "diagnoser", "serve", "--port", str(self.port), *extra_args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def alive() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ServerExitedError(f"server exited: {self.log.read_text()[-2000:]}")
            probe = httpx.get(f"{self.base_url}/healthz", headers=self.probe_headers, timeout=1)
            return probe.status_code == 200

        try:
            wait_until(alive, START_TIMEOUT_S, "diagnoser serve")
        except BaseException:
            self.kill()  # a server that never answered must not outlive its test
            raise

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(15)
            self.process = None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(15)
            self.process = None


def run_diagnoser(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    child: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`diagnoser ARGS...` as a user runs it: exit code, stdout and stderr as text, no exception.

    By default the console script's own click command runs in this process (a child process per
    call cost seconds of imports, a hundred times over); `child=True`, or a caller inside an
    event loop, gets a real child process (what `timeout` bounds). An exception the command did
    not turn into an exit code is raised here: a user would have seen a traceback.
    """
    if child or _in_event_loop():
        return subprocess.run(
            [sys.executable, "-m", "diagnoser", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
        )
    from click.testing import CliRunner

    runner = CliRunner(env=dict(env or {}))
    previous = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = runner.invoke(
            cast(click.Command, _ConsoleScript()), list(args), prog_name="diagnoser"
        )
    finally:
        os.chdir(previous)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["diagnoser", *args], result.exit_code, result.stdout, result.stderr
    )


class _ConsoleScript:
    """`diagnoser.cli.main` as CliRunner calls a command (its settings errors are main's)."""

    name = "diagnoser"

    def main(self, args: Sequence[str], prog_name: str, **extra: object) -> None:
        from diagnoser import cli

        cli.main(args)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def post_text(service: ServiceProcess, job: str, node: str, text: str) -> dict[str, object]:
    """One plain-text log upload for `node` of `job`; asserts it was accepted, returns the body."""
    response = httpx.post(
        f"{service.base_url}/v1/jobs/{job}/logs",
        params={"node": node},
        content=text.encode(),
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body
