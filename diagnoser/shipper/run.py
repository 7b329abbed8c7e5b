"""`diagnoser run`: launch the training command, ship its output, and report its lifecycle.

The wrapper a job's entrypoint uses so that diagnoser knows the job is running (hang detection
needs that) and how it ended:

1. `started` is posted; the command starts with stdout and stderr joined;
2. its output is copied to this process's stdout (the pod log stays as it was) and appended to
   a local log file, which the shipper follows and streams, resumable as `diagnoser ship -f`;
3. a `heartbeat` is posted every `--heartbeat-seconds` while the command runs;
4. when it ends, `exited` is posted with its exit code or signal, the shipper drains the file
   (up to `--drain-seconds`), and the wrapper exits with the command's own status.

Training never waits for diagnoser: the file on disk absorbs a slow or unreachable service, and
an event that cannot be posted is a warning, not an error. SIGINT and SIGTERM are passed on to
the command (a Kubernetes pod's stop reaches the trainer).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from diagnoser import __version__
from diagnoser.shipper.client import ShipError, Shipper, Stop, StreamTarget, UploadPolicy
from diagnoser.shipper.command import HTTP_TIMEOUT, check_server_url
from diagnoser.shipper.follow import CHUNK_BYTES, FileFollower
from diagnoser.shipper.progress import Progress

EVENT_TIMEOUT = httpx.Timeout(5.0)


class Lifecycle:
    """Posts the command's lifecycle events; a failure is reported once per kind and ignored."""

    def __init__(self, http: httpx.Client, target: StreamTarget, console: Console) -> None:
        self._http = http
        self._url = f"{target.server.rstrip('/')}/v1/jobs/{quote(target.job, safe='')}/events"
        self._node = target.node
        self._rank = target.rank
        self._console = console
        self._warned: set[str] = set()

    def post(self, kind: str, exit_code: int | None = None, signal_name: str | None = None) -> None:
        body: dict[str, object] = {"type": kind, "node": self._node}
        if self._rank is not None:
            body["rank"] = self._rank
        if exit_code is not None:
            body["exit_code"] = exit_code
        if signal_name is not None:
            body["signal"] = signal_name
        try:
            response = self._http.post(self._url, json=body, timeout=EVENT_TIMEOUT)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            if kind not in self._warned:
                self._warned.add(kind)
                self._console.print(f"[yellow]warning:[/] could not post `{kind}`: {exc}")


def run(
    command: Annotated[
        list[str], typer.Argument(help="The training command, after --.", show_default=False)
    ],
    server: Annotated[
        str, typer.Option("--server", help="Base URL of the diagnoser service.", show_default=False)
    ],
    job: Annotated[str, typer.Option("--job", help="Training job id.", show_default=False)],
    node: Annotated[str, typer.Option("--node", help="Node (host) name.", show_default=False)],
    rank: Annotated[int | None, typer.Option("--rank", min=0, help="Rank on the node.")] = None,
    log: Annotated[
        Path | None,
        typer.Option("--log", help="Local copy of the output [default: diagnoser-JOB-NODE.log]"),
    ] = None,
    heartbeat_seconds: Annotated[
        float, typer.Option("--heartbeat-seconds", min=1.0, help="Heartbeat interval.")
    ] = 60.0,
    drain_seconds: Annotated[
        float,
        typer.Option("--drain-seconds", min=0.0, help="How long to keep shipping after exit."),
    ] = 30.0,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="DIAGNOSER_TOKEN", help="Bearer token.", show_default=False),
    ] = None,
) -> None:
    """Run a training command: ship its output and post started / heartbeat / exited."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    problem = check_server_url(server)
    if problem:
        console.print(f"[bold red]error:[/] {escape(problem)}")
        raise typer.Exit(2)
    target = StreamTarget(server=server, job=job, node=node, rank=rank)
    log_path = log or Path(f"diagnoser-{job}-{node}.log")
    headers = {"User-Agent": f"diagnoser-run/{__version__}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(headers=headers, timeout=HTTP_TIMEOUT) as http:
        lifecycle = Lifecycle(http, target, console)
        lifecycle.post("started")
        try:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            lifecycle.post("exited", exit_code=127)
            console.print(f"[bold red]error:[/] cannot run {escape(command[0])}: {exc.strerror}")
            raise typer.Exit(127) from None
        assert child.stdout is not None
        with log_path.open("ab") as copy, _forwarding_signals(child):
            tee = threading.Thread(target=_tee, args=(child.stdout, copy), daemon=True)
            tee.start()
            follower = FileFollower(log_path, follow=True)
            stop = Stop()
            progress = Progress(console, live=False)
            shipper = Shipper(target, follower, http, progress, UploadPolicy(), stop)
            shipping = threading.Thread(target=_ship, args=(shipper, console), daemon=True)
            shipping.start()
            beating = Stop()
            beats = threading.Thread(
                target=_heartbeats, args=(lifecycle, heartbeat_seconds, beating), daemon=True
            )
            beats.start()
            status = child.wait()
            tee.join()
            beating.set()
        signal_name = signal.Signals(-status).name if status < 0 else None
        lifecycle.post("exited", exit_code=status if status >= 0 else None, signal_name=signal_name)
        follower.follow = False  # ship to the end of the file, then stop
        shipping.join(drain_seconds)
        stop.set()
        shipping.join(5)
        follower.close()
    raise typer.Exit(status if status >= 0 else 128 - status)


def _tee(source: IO[bytes], copy: IO[bytes]) -> None:
    """The command's output to our stdout and to the log file, as it comes."""
    out = sys.stdout.buffer
    while data := os.read(source.fileno(), CHUNK_BYTES):
        copy.write(data)
        copy.flush()
        with contextlib.suppress(OSError):  # a closed stdout must not stop the copy
            out.write(data)
            out.flush()


def _ship(shipper: Shipper, console: Console) -> None:
    try:
        shipper.run()
    except ShipError as exc:
        console.print(f"[yellow]warning:[/] shipping stopped: {escape(str(exc))}")


def _heartbeats(lifecycle: Lifecycle, interval: float, stop: Stop) -> None:
    while not stop.wait(interval):
        lifecycle.post("heartbeat")


@contextlib.contextmanager
def _forwarding_signals(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """SIGINT / SIGTERM to this wrapper go to the command, which decides how to stop."""
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in signals:
        signal.signal(sig, forward)
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])
