"""End-to-end HTTP ingest next to its framework floor, one uvicorn worker, over loopback.

    python bench/ingest.py                                   # default run, about 2-3 minutes
    python bench/ingest.py --single-mb 20 --multi-mb 4 --idle-streams 200   # a quick run

Every measurement gets a fresh server process (`bench/ingest_app.py`: the real app from
`create_app(settings)` on a temp SQLite data dir, plus ``POST /bench/floor``, which only counts
body bytes). The client is asyncio + httpx in this process: generated training-log lines, sent
as chunked uploads of 64 KiB chunks with ``offset`` set, every response checked for the exact
line count and next offset. The same bytes go to both routes, so the floor's lines are the
lines it was sent.

Server CPU comes from ``/proc/<pid>/stat`` before and after, RSS from ``/proc/<pid>/status``.
Client and server share this machine's cores, so besides wall-clock lines/s the table gives
lines per server CPU second: what one worker sustains when its core is busy with nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from processes import (
    TICKS,
    cpu_seconds,
    free_port,
    machine_busy_ticks,
    rss_bytes,
    wait_for_health,
)
from rich.console import Console
from rich.table import Table
from training_log import benign_line

APP = Path(__file__).with_name("ingest_app.py")
RESULTS = Path(__file__).with_name("results-ingest.md")
FLOOR_PATH = "/bench/floor"  # bench/ingest_app.py serves both
STAGES_PATH = "/bench/stages"
MIB = 1024 * 1024
TARGET_LINES_PER_S = 300_000
TARGET_FLOOR_RATIO = 2.0
TARGET_IDLE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Body:
    """One request body: whole lines, pre-cut into the chunks the client sends."""

    chunks: list[bytes]
    size: int
    lines: int


def make_bodies(count: int, size: int, chunk: int, seed: int = 7) -> list[Body]:
    rng = random.Random(seed)
    bodies: list[Body] = []
    n = 0
    for _ in range(count):
        lines: list[str] = []
        length = 0
        while length < size:
            line = benign_line(rng, n)
            lines.append(line)
            length += len(line) + 1
            n += 1
        data = ("\n".join(lines) + "\n").encode()
        chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        bodies.append(Body(chunks, len(data), len(lines)))
    return bodies


# --- the server process -------------------------------------------------------------------


@dataclass
class Server:
    pid: int
    base_url: str

    def stages(self) -> list[str]:
        names: list[str] = httpx.get(self.base_url + STAGES_PATH, timeout=5).json()
        return names


@contextlib.contextmanager
def serve(max_concurrent: int, profile: Path | None) -> Iterator[Server]:
    """A fresh `bench/ingest_app.py` on a temp data dir, stopped (SIGTERM) and removed after."""
    data_dir = Path(tempfile.mkdtemp(prefix="diagnoser-bench-"))
    port = free_port()
    command = [sys.executable, str(APP), "--data-dir", str(data_dir), "--port", str(port)]
    command += ["--max-concurrent-requests", str(max_concurrent)]
    if profile is not None:
        command += ["--profile", str(profile)]
    log = data_dir / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, base_url, log, 30)
        yield Server(process.pid, base_url)
    except BaseException:
        print(f"server log tail:\n{log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


async def settle(pid: int, quiet_s: float = 0.3, timeout_s: float = 15.0) -> None:
    """Wait until the server has used no CPU for `quiet_s`: it has handled what it was sent."""
    deadline = time.monotonic() + timeout_s
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = cpu_seconds(pid)
        if now == last:
            return
        last = now


# --- the client ---------------------------------------------------------------------------

TEXT = {"Content-Type": "text/plain"}


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    path: str | None
    """None: the real route, ``/v1/jobs/{job}/logs``."""

    def url(self, base_url: str, job: str) -> str:
        return base_url + (self.path or f"/v1/jobs/{job}/logs")


DIAGNOSER = Target("diagnoser", None)
FLOOR = Target("floor", FLOOR_PATH)


async def _chunks(body: Body) -> AsyncIterator[bytes]:
    for chunk in body.chunks:
        yield chunk


def _check(target: Target, response: httpx.Response, body: Body, offset: int) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{target.name}: HTTP {response.status_code}: {response.text[:500]}")
    result = response.json()
    if target is FLOOR:
        if result["bytes"] != body.size:
            raise RuntimeError(f"floor counted {result['bytes']} bytes of {body.size}")
    elif result["next_offset"] != offset + body.size:
        raise RuntimeError(f"diagnoser did not take the whole body: {result}")


MAX_ATTEMPTS = 5


@dataclass
class StreamTally:
    """What one stream's requests saw; failed attempts were resent, as a shipper would."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def _post(
    client: httpx.AsyncClient,
    target: Target,
    url: str,
    params: dict[str, str | int],
    body: Body,
    offset: int,
    tally: StreamTally,
) -> None:
    """Post one body; on a 5xx, 429 or broken connection resend it at the same offset (the
    server drops the bytes it already committed), at most MAX_ATTEMPTS times."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        started = time.perf_counter()
        try:
            response = await client.post(
                url, params={**params, "offset": offset}, content=_chunks(body), headers=TEXT
            )
        except httpx.TransportError as exc:
            failure, retry_after = type(exc).__name__, 0.2
        else:
            tally.latencies.append(time.perf_counter() - started)
            if response.status_code < 500 and response.status_code != 429:
                _check(target, response, body, offset)
                return
            failure = f"HTTP {response.status_code}"
            retry_after = float(response.headers.get("retry-after", "0.2"))
        tally.failures.append(failure)
        if attempt == MAX_ATTEMPTS:
            raise RuntimeError(f"{target.name}: {MAX_ATTEMPTS} attempts failed: {tally.failures}")
        await asyncio.sleep(retry_after)


async def _stream(
    client: httpx.AsyncClient,
    target: Target,
    job: str,
    index: int,
    bodies: list[Body],
    requests: int,
    tally: StreamTally,
) -> int:
    """Post `requests` bodies to one stream at increasing offsets; return the lines sent."""
    url = target.url(client_base(client), job)
    offset = lines = 0
    params: dict[str, str | int] = {"node": f"gpu-node-{index // 8:03d}", "rank": index}
    for number in range(requests):
        body = bodies[(index + number) % len(bodies)]
        await _post(client, target, url, params, body, offset, tally)
        offset += body.size
        lines += body.lines
    return lines


async def verify(
    client: httpx.AsyncClient, job: str, streams: int, bodies: list[Body], requests: int
) -> None:
    """Exactly once: every stream's committed offset and line count match what was sent."""
    for index in range(streams):
        sent = [bodies[(index + number) % len(bodies)] for number in range(requests)]
        params: dict[str, str | int] = {"node": f"gpu-node-{index // 8:03d}", "rank": index}
        response = await client.get(DIAGNOSER.url(client_base(client), job), params=params)
        status = response.raise_for_status().json()
        expected = (sum(body.size for body in sent), sum(body.lines for body in sent))
        if (status["committed_offset"], status["lines"]) != expected:
            raise RuntimeError(f"stream {index}: committed {status}, sent {expected}")


def client_base(client: httpx.AsyncClient) -> str:
    return str(client.base_url).rstrip("/")


@dataclass(frozen=True, slots=True)
class Run:
    scenario: str
    target: str
    lines: int
    size: int
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float
    other_cpu_s: float
    """CPU used by other processes on the machine during the run (shared cores)."""
    latencies: list[float]
    failures: list[str]
    rss_after: int

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.wall_s

    @property
    def cpu_per_million(self) -> float:
        return self.server_cpu_s / self.lines * 1e6

    @property
    def lines_per_cpu_s(self) -> float:
        # /proc counts in clock ticks: a tiny run can show none.
        return self.lines / max(self.server_cpu_s, 1 / TICKS)

    def latency_ms(self, quantile: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(quantile * (len(ordered) - 1)))] * 1000


async def throughput(
    server: Server, target: Target, scenario: str, streams: int, requests: int, bodies: list[Body]
) -> Run:
    job = f"bench-{scenario}".replace(" ", "-")
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(
        base_url=server.base_url, limits=limits, timeout=httpx.Timeout(300)
    ) as client:
        first = bodies[0].chunks[0]
        warm = await client.post(
            target.url(server.base_url, "bench-warmup"),
            params={"node": "warmup", "offset": 0},
            content=first[: first.rfind(b"\n") + 1],
            headers=TEXT,
        )
        warm.raise_for_status()
        await settle(server.pid)
        tallies = [StreamTally() for _ in range(streams)]
        cpu_before, client_before = cpu_seconds(server.pid), time.process_time()
        busy_before = machine_busy_ticks()
        started = time.perf_counter()
        sent = await asyncio.gather(
            *(_stream(client, target, job, i, bodies, requests, tallies[i]) for i in range(streams))
        )
        wall = time.perf_counter() - started
        cpu_after, client_after = cpu_seconds(server.pid), time.process_time()
        busy_after = machine_busy_ticks()
        if target is DIAGNOSER:
            await verify(client, job, streams, bodies, requests)
    server_cpu, client_cpu = cpu_after - cpu_before, client_after - client_before
    return Run(
        scenario,
        target.name,
        sum(sent),
        sum(bodies[(i + n) % len(bodies)].size for i in range(streams) for n in range(requests)),
        wall,
        server_cpu,
        client_cpu,
        max(0.0, (busy_after - busy_before) / TICKS - server_cpu - client_cpu),
        [latency for tally in tallies for latency in tally.latencies],
        [failure for tally in tallies for failure in tally.failures],
        rss_bytes(server.pid),
    )


@dataclass(frozen=True, slots=True)
class Idle:
    target: str
    streams: int
    wave: int
    open: int
    """Uploads still open when RSS was read (the others failed)."""
    failures: list[str]
    rss_before: int
    rss_open: int

    @property
    def per_stream(self) -> float:
        return (self.rss_open - self.rss_before) / max(1, self.open)


async def idle_streams(server: Server, target: Target, streams: int, wave: int) -> Idle:
    """Open `streams` uploads, `wave` at a time, send a few lines on each and hold them open;
    RSS delta / open uploads."""
    small = b"".join(benign_line(random.Random(i), i).encode() + b"\n" for i in range(3))
    body = Body([small], len(small), 3)
    release = asyncio.Event()
    failures: list[str] = []

    async def held(sent: asyncio.Event) -> AsyncIterator[bytes]:
        yield small
        sent.set()
        await release.wait()

    async def one(client: httpx.AsyncClient, index: int, sent: asyncio.Event | None) -> None:
        params: dict[str, str | int] = {"node": f"idle-{index // 8}", "rank": index, "offset": 0}
        url = target.url(server.base_url, "bench-idle")
        content = _chunks(body) if sent is None else held(sent)
        try:
            response = await client.post(url, params=params, content=content, headers=TEXT)
        except httpx.TransportError as exc:
            failures.append(type(exc).__name__)
            return
        if response.status_code != 200:
            failures.append(f"HTTP {response.status_code}")
            return
        _check(target, response, body, 0)

    limits = httpx.Limits(max_connections=streams + 16, max_keepalive_connections=streams + 16)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120)) as client:
        # Warm the route and the connection machinery before the baseline.
        await asyncio.gather(*(one(client, streams + i, None) for i in range(8)))
        await settle(server.pid)
        before = rss_bytes(server.pid)
        tasks: list[asyncio.Task[None]] = []
        try:
            for first in range(0, streams, wave):
                sent = [asyncio.Event() for _ in range(first, min(streams, first + wave))]
                tasks += [
                    asyncio.create_task(one(client, first + n, event))
                    for n, event in enumerate(sent)
                ]
                waits = [asyncio.create_task(event.wait()) for event in sent]
                _, pending = await asyncio.wait(waits, timeout=60)
                for waiting in pending:
                    waiting.cancel()
                await settle(server.pid)
            after = rss_bytes(server.pid)
            still_open = sum(not task.done() for task in tasks)
        finally:
            release.set()
        await asyncio.gather(*tasks)
    return Idle(target.name, streams, wave, still_open, failures, before, after)


# --- the report ---------------------------------------------------------------------------


def tree() -> str:
    """The commit measured, and whether the working tree had changes on top of it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head}{' with uncommitted changes' if dirty else ''}"


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB RAM, "
        f"{platform.python_implementation()} {platform.python_version()}, {platform.system()} "
        f"{platform.release()}"
    )


def _ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x" if floor > 0 else "-"


HEADERS = (
    "scenario",
    "route",
    "lines",
    "MB",
    "wall s",
    "lines/s",
    "server CPU %",
    "client CPU %",
    "other CPU %",
    "server CPU s / M lines",
    "lines / server CPU s",
    "p50 ms",
    "p99 ms",
    "server RSS after MiB",
    "failed attempts",
    "lines/s vs floor",
    "CPU/line vs floor",
)


def _failures(failures: list[str]) -> str:
    if not failures:
        return "0"
    kinds = Counter(failures)
    return f"{len(failures)} (" + ", ".join(f"{n}x {kind}" for kind, n in kinds.items()) + ")"


def rows(runs: list[Run]) -> list[list[str]]:
    floors = {run.scenario: run for run in runs if run.target == FLOOR.name}
    out: list[list[str]] = []
    for run in runs:
        floor = floors.get(run.scenario)
        versus = ["-", "-"]
        if run.target != FLOOR.name and floor is not None:
            versus = [
                _ratio(run.lines_per_s, floor.lines_per_s),
                _ratio(run.cpu_per_million, floor.cpu_per_million),
            ]
        out.append(
            [
                run.scenario,
                run.target,
                f"{run.lines:,}",
                f"{run.size / 1e6:,.0f}",
                f"{run.wall_s:.2f}",
                f"{run.lines_per_s:,.0f}",
                f"{100 * run.server_cpu_s / run.wall_s:.0f}",
                f"{100 * run.client_cpu_s / run.wall_s:.0f}",
                f"{100 * run.other_cpu_s / run.wall_s:.0f}",
                f"{run.cpu_per_million:.2f}",
                f"{run.lines_per_cpu_s:,.0f}",
                f"{run.latency_ms(0.5):,.1f}",
                f"{run.latency_ms(0.99):,.1f}",
                f"{run.rss_after / MIB:.0f}",
                _failures(run.failures),
                *versus,
            ]
        )
    return out


IDLE_HEADERS = (
    "idle uploads",
    "opened per wave",
    "route",
    "still open",
    "failed",
    "RSS before MiB",
    "RSS, uploads open, MiB",
    "per open upload KiB",
)


def idle_rows(idle: list[Idle]) -> list[list[str]]:
    return [
        [
            f"{r.streams:,}",
            f"{r.wave:,}",
            r.target,
            f"{r.open:,}",
            _failures(r.failures),
            f"{r.rss_before / MIB:.1f}",
            f"{r.rss_open / MIB:.1f}",
            f"{r.per_stream / 1024:.1f}",
        ]
        for r in idle
    ]


def verdicts(runs: list[Run], idle: list[Idle]) -> list[str]:
    out: list[str] = []
    floors = {run.scenario: run for run in runs if run.target == FLOOR.name}
    for run in runs:
        floor = floors.get(run.scenario)
        if run.target != DIAGNOSER.name or floor is None or not floor.server_cpu_s:
            continue
        wall_ok = run.lines_per_s >= TARGET_LINES_PER_S
        core_ok = run.lines_per_cpu_s >= TARGET_LINES_PER_S
        ratio = run.cpu_per_million / floor.cpu_per_million
        out.append(
            f"{run.scenario}: >= {TARGET_LINES_PER_S:,} lines/s per worker: "
            f"{'met' if wall_ok else 'NOT met'} on the wall clock ({run.lines_per_s:,.0f}), "
            f"{'met' if core_ok else 'NOT met'} per server CPU second "
            f"({run.lines_per_cpu_s:,.0f}); within {TARGET_FLOOR_RATIO:g}x of the floor "
            f"(server CPU per line): {'met' if ratio <= TARGET_FLOOR_RATIO else 'NOT met'} "
            f"({ratio:.2f}x)"
        )
    for result in idle:
        ok = result.per_stream < TARGET_IDLE_BYTES
        out.append(
            f"idle streams ({result.target}): < {TARGET_IDLE_BYTES // 1024} KiB each: "
            f"{'met' if ok else 'NOT met'} ({result.per_stream / 1024:.1f} KiB)"
        )
    return out


def markdown(command: str, stages: list[str], runs: list[Run], idle: list[Idle]) -> str:
    lines = [
        "## HTTP ingest, end to end (`bench/ingest.py`)",
        "",
        f"Machine: {machine()}.",
        "",
        f"Command: `{command}`",
        "",
        f"Tree: {tree()}; pipeline stages: {', '.join(stages) or 'none'}.",
        "",
        "One uvicorn worker (uvloop + httptools) serving `create_app(settings)` on a fresh temp "
        "SQLite data dir per row; `floor` is `POST /bench/floor` in the same app and process, "
        "which only counts body bytes. Client: asyncio + httpx in the bench process, on the same "
        "cores, chunked uploads of 64 KiB chunks of generated training-log lines (~130 bytes) "
        "with `offset`; all streams of a scenario belong to one job (one rank each). Every "
        "response is checked and, for diagnoser, every stream's committed offset and line count "
        "afterwards. Latency is per request (one request = one body of several MB). "
        "`lines / server CPU s` is what one worker sustains when its core is busy with nothing "
        "else; `other CPU %` is CPU used by other processes on the machine during the row (100 = "
        "one core), a warning sign for the wall-clock columns. Failed attempts were resent at the "
        "same offset, as a shipper does.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
        *("| " + " | ".join(row) + " |" for row in rows(runs)),
        "",
        "| " + " | ".join(IDLE_HEADERS) + " |",
        "|" + "---|" * len(IDLE_HEADERS),
        *("| " + " | ".join(row) + " |" for row in idle_rows(idle)),
        "",
        "Targets:",
        "",
        *(f"- {verdict}" for verdict in verdicts(runs, idle)),
        "",
    ]
    return "\n".join(lines)


def print_tables(console: Console, runs: list[Run], idle: list[Idle]) -> None:
    table = Table(title="HTTP ingest, one worker", title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in {"scenario", "route"} else "right")
    for row in rows(runs):
        table.add_row(*row)
    console.print(table)
    memory = Table(title="Idle open streams", title_justify="left")
    for header in IDLE_HEADERS:
        memory.add_column(header, justify="right")
    for row in idle_rows(idle):
        memory.add_row(*row)
    console.print(memory)
    for verdict in verdicts(runs, idle):
        console.print(f"- {verdict}", markup=False, highlight=False)


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single-mb", type=float, default=200, help="MB per stream, 1 stream")
    parser.add_argument("--multi-mb", type=float, default=50, help="MB per stream, N streams")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams (N)")
    parser.add_argument("--requests", type=int, default=4, help="requests per stream")
    parser.add_argument("--chunk-kib", type=int, default=64)
    parser.add_argument("--idle-streams", type=int, default=1000)
    parser.add_argument("--idle-wave", type=int, default=100, help="idle uploads opened at once")
    parser.add_argument("--targets", default="diagnoser,floor", help="comma-separated routes")
    parser.add_argument("--profile-dir", type=Path, help="write server cProfile stats here")
    parser.add_argument("--output", type=Path, default=RESULTS, help="markdown results file")
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(width=250)
    targets = [{"diagnoser": DIAGNOSER, "floor": FLOOR}[t] for t in args.targets.split(",")]
    chunk = args.chunk_kib * 1024
    scenarios = [
        ("1 stream", 1, args.single_mb),
        (f"{args.streams} streams", args.streams, args.multi_mb),
    ]
    runs: list[Run] = []
    stages: list[str] = []
    for scenario, streams, megabytes in scenarios:
        size = max(chunk, round(megabytes * 1e6 / args.requests))
        bodies = make_bodies(min(4, streams * args.requests), size, chunk)
        for target in targets:
            profile = None
            if args.profile_dir is not None:
                args.profile_dir.mkdir(parents=True, exist_ok=True)
                profile = args.profile_dir / f"{scenario.replace(' ', '-')}-{target.name}.pstats"
            with serve(512, profile) as server:
                stages = server.stages()
                run = asyncio.run(
                    throughput(server, target, scenario, streams, args.requests, bodies)
                )
            runs.append(run)
            console.print(
                f"{scenario} {target.name}: {run.lines_per_s:,.0f} lines/s, "
                f"{run.cpu_per_million:.2f} server CPU s per M lines",
                highlight=False,
            )
    idle: list[Idle] = []
    if args.idle_streams:
        for target in targets:
            with serve(args.idle_streams + 64, None) as server:
                idle.append(
                    asyncio.run(idle_streams(server, target, args.idle_streams, args.idle_wave))
                )
    print_tables(console, runs, idle)
    if not args.no_write:
        command = shlex.join(
            ["python", "bench/ingest.py", *(sys.argv[1:] if argv is None else argv)]
        )
        args.output.write_text(markdown(command, stages, runs, idle))
        console.print(f"written to {args.output}")


if __name__ == "__main__":
    main()
