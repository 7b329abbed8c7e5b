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
from diagnoser.shipper.command import (
    HTTP_TIMEOUT,
    JobOption,
    NodeOption,
    RankOption,
    ServerOption,
    TokenOption,
    check_server_url,
)
from diagnoser.shipper.follow import CHUNK_BYTES, FileFollower
from diagnoser.shipper.progress import Progress

EVENT_TIMEOUT = httpx.Timeout(5.0)
FOREVER = 10.0**9
"""How long an absent server is waited for at start: until the drain after exit stops it."""
TEE_GRACE_SECONDS = 2.0
"""How long output is still read after the command exits (a left-over process may hold it)."""
SHIPPER_STOP_SECONDS = 2.0


class EventPoster:
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
                self._console.print(
                    f"[yellow]warning:[/] could not post `{kind}`: {escape(str(exc))}"
                )


def run(
    command: Annotated[
        list[str], typer.Argument(help="The training command, after --.", show_default=False)
    ],
    server: ServerOption,
    job: JobOption,
    node: NodeOption,
    rank: RankOption = None,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log", help="Local copy of the output [default: diagnoser-JOB-NODE[-RANK].log]"
        ),
    ] = None,
    heartbeat_seconds: Annotated[
        float, typer.Option("--heartbeat-seconds", min=1.0, help="Heartbeat interval.")
    ] = 60.0,
    drain_seconds: Annotated[
        float,
        typer.Option("--drain-seconds", min=0.0, help="How long to keep shipping after exit."),
    ] = 20.0,
    token: TokenOption = None,
) -> None:
    """Run a training command: ship its output and post started / heartbeat / exited."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    problem = check_server_url(server)
    if problem:
        console.print(f"[bold red]error:[/] {escape(problem)}")
        raise typer.Exit(2)
    target = StreamTarget(server=server, job=job, node=node, rank=rank)
    suffix = "" if rank is None else f"-{rank}"
    log_path = log or Path(f"diagnoser-{job}-{node}{suffix}.log")
    try:
        copy = log_path.open("ab")
    except OSError as exc:
        reason = escape(f"{log_path}: {exc.strerror or exc}")
        console.print(f"[bold red]error:[/] cannot write {reason}")
        raise typer.Exit(2) from None
    headers = {"User-Agent": f"diagnoser-run/{__version__}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with copy, httpx.Client(headers=headers, timeout=HTTP_TIMEOUT) as http, _Signals() as signals:
        known_size = copy.tell()
        lifecycle = EventPoster(http, target, console)
        lifecycle.post("started")
        if signals.received is not None:  # stopped before the command even started
            lifecycle.post("exited", signal_name=signals.received.name)
            raise typer.Exit(128 + signals.received)
        try:
            # Its own session: a terminal's Ctrl-C reaches it once, through us, and a stop
            # reaches every process it started.
            child = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            lifecycle.post("exited", exit_code=127)
            reason = escape(f"{command[0]}: {exc.strerror}")
            console.print(f"[bold red]error:[/] cannot run {reason}")
            raise typer.Exit(127) from None
        signals.forward_to(child)
        follower = FileFollower(log_path, follow=True, known_size=known_size)
        # The server may come up after the job: keep asking for the resume offset until drained.
        shipper = Shipper(
            target,
            follower,
            http,
            Progress(console, live=False),
            UploadPolicy(start_timeout_s=FOREVER),
        )
        shipping = threading.Thread(target=_ship, args=(shipper, console), daemon=True)
        shipping.start()
        status = _supervise(child, copy, lifecycle, console, heartbeat_seconds)
        follower.follow = False  # ship to the end of the file, then stop
        shipping.join(drain_seconds)
        shipper.stop.set()
        shipping.join(SHIPPER_STOP_SECONDS)
        follower.close()
    raise typer.Exit(status if status >= 0 else 128 - status)


def _supervise(
    child: subprocess.Popen[bytes],
    copy: IO[bytes],
    lifecycle: EventPoster,
    console: Console,
    heartbeat_seconds: float,
) -> int:
    """Copy the output and beat the heart until the command ends; then post `exited`."""
    assert child.stdout is not None
    tee = threading.Thread(target=_tee, args=(child.stdout, copy, console), daemon=True)
    tee.start()
    beating = Stop()
    beats = threading.Thread(
        target=_heartbeats, args=(lifecycle, heartbeat_seconds, beating), daemon=True
    )
    beats.start()
    status = child.wait()
    beating.set()
    # A process the command left behind may hold the pipe open: do not wait for it long.
    tee.join(TEE_GRACE_SECONDS)
    exit_code, signal_name = _exit_fields(status)
    lifecycle.post("exited", exit_code=exit_code, signal_name=signal_name)
    return status


def _exit_fields(status: int) -> tuple[int | None, str | None]:
    """`exited` fields for a return code: the code, or the signal that ended the command."""
    if status >= 0:
        return status, None
    try:
        return None, signal.Signals(-status).name
    except ValueError:  # a real-time signal has no name
        return None, f"SIG{-status}"


def _tee(source: IO[bytes], copy: IO[bytes], console: Console) -> None:
    """The command's output to our stdout and to the log file, as it comes.

    Reading never stops while the command writes: a full disk or a closed stdout loses that
    copy (with one warning), never blocks the training on a full pipe.
    """
    out = sys.stdout.buffer if sys.stdout is not None else None
    to_file = True
    while data := os.read(source.fileno(), CHUNK_BYTES):
        if to_file:
            try:
                copy.write(data)
                copy.flush()
            except OSError as exc:
                to_file = False
                reason = escape(str(exc))
                console.print(f"[yellow]warning:[/] the log copy stopped: {reason}; not shipped")
        if out is not None:
            try:
                out.write(data)
                out.flush()
            except (OSError, ValueError):
                out = None


def _ship(shipper: Shipper, console: Console) -> None:
    try:
        shipper.run()
    except ShipError as exc:
        console.print(f"[yellow]warning:[/] shipping stopped: {escape(str(exc))}")


def _heartbeats(lifecycle: EventPoster, interval: float, stop: Stop) -> None:
    while not stop.wait(interval):
        lifecycle.post("heartbeat")


class _Signals:
    """SIGINT / SIGTERM: remembered before the command starts, passed on to its process group
    once it runs (the command decides how to stop)."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, object] = {}

    def forward_to(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        if self.received is not None:
            self._send(self.received)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.received = signal.Signals(signum)
        if self._child is not None:
            self._send(self.received)

    def _send(self, sig: signal.Signals) -> None:
        assert self._child is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._child.pid, sig)

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
