"""`diagnoser ship`: the shipper's composition root (the CLI registers `ship` as a command).

Exit codes: 0 done (or stopped by SIGINT/SIGTERM after finishing the in-flight request);
1 the server rejected the upload for good, or the file could not be read mid-way;
2 bad usage: unparsable or unreachable server URL, missing or unreadable file, wrong endpoint;
3 authentication refused (401: no valid token; 403: the token's role or node binding does not
allow this stream); 130 a second interrupt, which does not wait.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from diagnoser import __version__
from diagnoser.shipper.client import (
    ExitCode,
    ShipError,
    Shipper,
    Source,
    Stop,
    StreamTarget,
    UploadPolicy,
)
from diagnoser.shipper.follow import FileFollower
from diagnoser.shipper.pipe import PipeReader
from diagnoser.shipper.progress import Progress

HTTP_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=30.0, pool=5.0)


ServerOption = Annotated[
    str, typer.Option("--server", help="Base URL of the diagnoser service.", show_default=False)
]
ServersOption = Annotated[
    list[str],
    typer.Option(
        "--server",
        help=(
            "Base URL of the diagnoser service; repeat it for replicas without a load balancer "
            "in front: a failed connection moves the stream to the next."
        ),
        show_default=False,
    ),
]
JobOption = Annotated[str, typer.Option("--job", help="Training job id.", show_default=False)]
NodeOption = Annotated[str, typer.Option("--node", help="Node (host) name.", show_default=False)]
RankOption = Annotated[int | None, typer.Option("--rank", min=0, help="Rank on the node.")]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="DIAGNOSER_TOKEN",
        help=(
            "Bearer token (an ingest token from `diagnoser token create --role ingest`), sent "
            "as 'Authorization: Bearer'; the environment keeps it out of `ps`."
        ),
        show_default=False,
    ),
]
"""Options `ship` and `run` share: where the stream goes and how to authenticate."""


def ship(
    path: Annotated[
        str,
        typer.Argument(metavar="PATH|-", help="Log file to ship, or - for standard input."),
    ],
    server: ServersOption,
    job: JobOption,
    node: NodeOption,
    rank: RankOption = None,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Stream id (default: NODE, or NODE/RANK).")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Follow like tail -F until SIGINT/SIGTERM; else stop at EOF."
        ),
    ] = False,
    token: TokenOption = None,
    max_request_mib: Annotated[
        float, typer.Option("--max-request-mib", min=0.0625, help="Bytes per upload request.")
    ] = 8.0,
    max_request_seconds: Annotated[
        float, typer.Option("--max-request-seconds", min=0.1, help="Duration of an upload request.")
    ] = 10.0,
    start_timeout: Annotated[
        float,
        typer.Option("--start-timeout", min=0.0, help="Seconds to retry a server down at start."),
    ] = 10.0,
) -> None:
    """Stream a log file (or stdin) to the diagnoser; resume after failures, losing and doubling
    no line."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    target = StreamTarget(server=server[0], job=job, node=node, rank=rank, stream=stream)
    problem = next(filter(None, map(check_server_url, server)), None)
    problem = problem or _check_path(path, follow=follow)
    if problem:
        raise _fail(console, problem, ExitCode.USAGE)
    policy = UploadPolicy(
        max_request_bytes=int(max_request_mib * 1024 * 1024),
        max_request_seconds=max_request_seconds,
        start_timeout_s=start_timeout,
    )
    headers = {"User-Agent": f"diagnoser-ship/{__version__}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    stop = Stop()
    progress = Progress(console, live=console.is_terminal)
    source: Source
    if path == "-":
        source = PipeReader(sys.stdin.fileno(), notify=progress.warn)
    else:
        source = FileFollower(Path(path), follow=follow, notify=progress.warn)
    try:
        with (
            _stopping_on_signals(stop),
            httpx.Client(headers=headers, timeout=HTTP_TIMEOUT) as http,
            progress,
        ):
            Shipper(target, source, http, progress, policy, stop, tuple(server[1:])).run()
    except ShipError as exc:
        raise _fail(console, str(exc), exc.exit_code) from None
    except OSError as exc:
        code = ExitCode.USAGE if progress.stats.requests == 0 else ExitCode.REJECTED
        raise _fail(console, f"cannot read {path}: {exc.strerror or exc}", code) from None
    except KeyboardInterrupt:
        raise _fail(console, "interrupted", 130) from None
    finally:
        if isinstance(source, FileFollower):
            source.close()
    where = f"{server[0]} job {job} stream {target.stream_id}"
    console.print(progress.summary(where), markup=False)


def _fail(console: Console, message: str, code: int) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def check_server_url(server: str) -> str | None:
    try:
        url = httpx.URL(server)
    except httpx.InvalidURL as exc:
        return f"invalid --server URL {server!r}: {exc}"
    if url.scheme not in ("http", "https") or not url.host:
        return f"invalid --server URL {server!r}: expected http(s)://host[:port]"
    return None


def _check_path(path: str, *, follow: bool) -> str | None:
    """Fail fast, before contacting the server, on a file that cannot be shipped."""
    if path == "-":
        return None
    file = Path(path)
    if not file.exists():
        return None if follow else f"no such file: {path} (use --follow to wait for it)"
    if not file.is_file():
        return f"{path} is not a regular file (use - to ship a pipe from stdin)"
    return None


@contextmanager
def _stopping_on_signals(stop: Stop) -> Iterator[None]:
    """The first SIGINT/SIGTERM asks for a clean stop; a second one acts as if unhandled."""
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        stop.set()
        for sig in signals:
            signal.signal(sig, previous[sig])
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    for sig in signals:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])
