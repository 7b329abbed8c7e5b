"""Time to diagnosis on the rule path: from the POST with a decisive line to the diagnosis on GET.

    python bench/diagnosis.py                          # 200 samples per scenario, ~2-4 minutes
    python bench/diagnosis.py --samples 50 --streams 16             # a quick run
    python bench/diagnosis.py --profile /tmp/diag.pstats            # cProfile the loaded server
    python bench/diagnosis.py --rates 30000,60000,100000   # open-loop scenarios, closed loop too

Each scenario gets a fresh ``diagnoser serve`` (a subprocess on a free loopback port, temp data
dir, embedded SQLite, every other setting at its default) and is measured the same way:

* a sample is a fresh job: one POST (``text/plain``) of a benign prefix followed by
  ``NVRM: Xid ... 79, GPU has fallen off the bus``; from the moment the POST is sent, a poller
  on its own connection GETs ``/v1/jobs/{job}/diagnoses`` every ``--poll-ms`` until the
  ``cordon_node_and_restart`` diagnosis naming the node is there (bounded by ``--timeout-s``).
  Recorded: the POST round trip, and the time until the diagnosis is visible on GET (the end
  of the first GET that returned it). The POST's ``diagnoses`` must name the same id.
* ``idle``: nothing else is running (the peer). ``N streams, closed loop``: a separate load
  process keeps N streams (8 jobs, 8 node/rank streams each) POSTing ~64 KiB bodies of benign
  training-log lines back to back for the whole measurement: step/loss lines, NCCL INFO,
  warnings. With one worker this saturates the server, so latency there is mostly queueing.
* ``N streams, R lines/s`` (``--rate``/``--rates``, open loop): the same N streams send the
  same bodies on a fixed schedule adding up to R lines/s in total. Stream s starts s/N of an
  interval in; each next send is due at the previous due time + (lines of that body) / (R/N),
  whatever the responses do, on up to ``--inflight`` keep-alive connections per stream. A
  send due while all of them are busy is missed (skipped, the schedule goes on); one that
  starts more than ``--late-ms`` after its due time is late. Offered and achieved lines/s are
  reported side by side. Every scenario, idle included, runs in the same invocation.

The load process speaks HTTP/1.1 over asyncio streams with pre-encoded requests, so the client
side costs as little CPU as possible on a machine the server shares; the probe uses httpx.
Server and load CPU come from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import pstats
import queue
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import httpx
from processes import cpu_seconds, free_port, machine_busy_seconds, wait_for_health
from rich.console import Console
from rich.table import Table
from training_log import benign_text

RESULTS = Path(__file__).with_name("results-diagnosis.md")
ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 200.0
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
ACTION = "cordon_node_and_restart"
LOAD_JOBS = 8
KIB = 1024


# --- the server process -------------------------------------------------------------------


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Server:
    pid: int
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def server_command(data_dir: Path, port: int, profile: Path | None) -> list[str]:
    serve = ["-m", "diagnoser", "serve", "--data-dir", str(data_dir), "--port", str(port)]
    if profile is None:
        return [sys.executable, *serve]
    return [sys.executable, "-m", "cProfile", "-o", str(profile), *serve]


@contextlib.contextmanager
def serve(profile: Path | None = None) -> Iterator[Server]:
    """A fresh ``diagnoser serve`` on a temp data dir; SIGTERM and removal afterwards."""
    data_dir = Path(tempfile.mkdtemp(prefix="diagnoser-bench-diag-"))
    port = free_port()
    log = data_dir / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            server_command(data_dir, port, profile),
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    server = Server(process.pid, port)
    try:
        wait_for_health(process, server.base_url, log, 60)
        yield server
    except BaseException:
        print(f"server log tail:\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        # cProfile writes its stats on the KeyboardInterrupt uvicorn re-raises after SIGINT.
        process.send_signal(signal.SIGTERM if profile is None else signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


# --- the background load (its own process) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadBody:
    data: bytes
    lines: int


@dataclass
class LoadCounters:
    """Shared with the load process: totals so far, read by the parent at window edges."""

    lines: Synchronized[int]
    requests: Synchronized[int]
    errors: Synchronized[int]
    streams_up: Synchronized[int]
    measuring: Synchronized[int]
    """1 while the probe runs: the load process then records its requests' latencies."""
    sends: Synchronized[int]
    """Open loop: sends that came due (sent or missed)."""
    missed: Synchronized[int]
    """Open loop: sends skipped because the stream had `inflight` requests outstanding."""
    late: Synchronized[int]
    """Open loop: sends that started more than `late_s` after their due time."""


def bump(counter: Synchronized[int], by: int = 1) -> None:
    with counter.get_lock():
        counter.value += by


def load_bodies(count: int, size: int, seed: int = 11) -> list[LoadBody]:
    rng = random.Random(seed)
    bodies: list[LoadBody] = []
    n = 0
    for _ in range(count):
        text, lines = benign_text(rng, size, n)
        n += lines
        bodies.append(LoadBody(text.encode(), lines))
    return bodies


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def encode_requests(
    port: int, job: str, node: str, rank: int, bodies: list[LoadBody]
) -> list[tuple[bytes, int]]:
    """Whole HTTP/1.1 requests, one per body, with each body's line count."""
    head = (
        f"POST /v1/jobs/{job}/logs?node={node}&rank={rank} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n"
    )
    return [
        (f"{head}Content-Length: {len(body.data)}\r\n\r\n".encode() + body.data, body.lines)
        for body in bodies
    ]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the server keeps the connection (uvicorn sends a length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    length = 0
    keep = True
    for header in header_lines:
        name, _, value = header.partition(":")
        lowered = name.strip().lower()
        if lowered == "content-length":
            length = int(value)
        elif lowered == "connection" and value.strip().lower() == "close":
            keep = False
    return status, await reader.readexactly(length), keep


async def _post(
    port: int,
    request: bytes,
    lines: int,
    idle: list[Connection],
    counters: LoadCounters,
    failures: Counter[str],
    latencies: list[float],
) -> bool:
    """One POST on an idle keep-alive connection (a new one if none); True if all lines in."""
    connection = idle.pop() if idle else None
    started = time.perf_counter()
    try:
        if connection is None:
            connection = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = connection
        writer.write(request)
        await writer.drain()
        status, body, keep = await _read_response(reader)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        if connection is not None:
            connection[1].close()
        failures[type(exc).__name__] += 1
        bump(counters.errors)
        return False
    if keep:
        idle.append(connection)
    else:
        connection[1].close()
    if status != 200 or json.loads(body)["lines_accepted"] != lines:
        failures[f"HTTP {status}" if status != 200 else "short count"] += 1
        bump(counters.errors)
        return False
    if counters.measuring.value:
        latencies.append(time.perf_counter() - started)
    bump(counters.lines, lines)
    bump(counters.requests)
    return True


@dataclass
class StreamRun:
    """What every stream of one load process shares."""

    port: int
    stop: EventType
    deadline: float
    counters: LoadCounters
    failures: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    """Open loop: due time to start of each send, recorded while the probe runs."""

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def first_success(self) -> None:
        bump(self.counters.streams_up)


async def _closed_loop_stream(
    run: StreamRun, requests: list[tuple[bytes, int]], offset: int
) -> None:
    """One stream: POST the bodies round-robin, back to back, on one keep-alive connection."""
    idle: list[Connection] = []
    up = False
    i = offset
    while run.running():
        request, lines = requests[i % len(requests)]
        i += 1
        if not await _post(
            run.port, request, lines, idle, run.counters, run.failures, run.latencies
        ):
            await asyncio.sleep(0.05)
            continue
        if not up:
            up = True
            run.first_success()
    for _, writer in idle:
        writer.close()


async def _open_loop_stream(
    run: StreamRun,
    requests: list[tuple[bytes, int]],
    offset: int,
    first_due: float,
    lines_per_s: float,
    inflight: int,
    late_s: float,
) -> None:
    """One stream: POST the bodies round-robin on a fixed schedule of `lines_per_s`.

    The next send is due at the previous due time + that body's lines / `lines_per_s`, whether
    or not earlier responses are in. Up to `inflight` requests are outstanding at once, each on
    its own keep-alive connection; a send that comes due while all are busy is missed.
    """
    idle: list[Connection] = []
    outstanding: set[asyncio.Task[None]] = set()
    up = False

    async def send(request: bytes, lines: int, due: float) -> None:
        nonlocal up
        lag = time.monotonic() - due
        if lag > late_s:
            bump(run.counters.late)
        if run.counters.measuring.value:
            run.lags.append(lag)
        if (
            await _post(run.port, request, lines, idle, run.counters, run.failures, run.latencies)
            and not up
        ):
            up = True
            run.first_success()

    due = first_due
    i = offset
    while run.running():
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            if not run.running():
                break
        request, lines = requests[i % len(requests)]
        i += 1
        bump(run.counters.sends)
        if len(outstanding) >= inflight:
            bump(run.counters.missed)
        else:
            task = asyncio.create_task(send(request, lines, due))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
        due += lines / lines_per_s
    for task in list(outstanding):
        task.cancel()
    await asyncio.gather(*outstanding, return_exceptions=True)
    for _, writer in idle:
        writer.close()


@dataclass(frozen=True)
class LoadPlan:
    streams: int
    body_kib: int
    rate: float | None
    """Total lines/s over all streams (open loop), or None: back to back (closed loop)."""
    inflight: int
    late_s: float


async def _load(
    plan: LoadPlan, port: int, stop: EventType, max_s: float, counters: LoadCounters
) -> LoadReport:
    bodies = load_bodies(16, plan.body_kib * KIB)
    run = StreamRun(port, stop, time.monotonic() + max_s, counters)
    per_job = max(1, math.ceil(plan.streams / LOAD_JOBS))
    streams: list[Coroutine[None, None, None]] = []
    start = time.monotonic() + 0.1
    for s in range(plan.streams):
        requests = encode_requests(
            port, f"load-{s // per_job}", f"gpu-node-{s % per_job:03d}", s % 8, bodies
        )
        if plan.rate is None:
            streams.append(_closed_loop_stream(run, requests, s))
            continue
        lines_per_s = plan.rate / plan.streams
        interval = sum(body.lines for body in bodies) / len(bodies) / lines_per_s
        streams.append(
            _open_loop_stream(
                run,
                requests,
                s,
                start + interval * s / plan.streams,
                lines_per_s,
                plan.inflight,
                plan.late_s,
            )
        )
    await asyncio.gather(*streams)
    return LoadReport(dict(run.failures), run.latencies, run.lags)


def run_load(
    plan: LoadPlan,
    port: int,
    stop: EventType,
    max_s: float,
    counters: LoadCounters,
    report: mp.Queue[LoadReport],
) -> None:
    """Entry point of the load process: until `stop` is set, or `max_s` at the latest."""
    report.put(asyncio.run(_load(plan, port, stop, max_s, counters)))


@dataclass
class LoadReport:
    failures: dict[str, int] = field(default_factory=dict)
    """Failed requests by kind, over the whole run (settling included)."""
    latencies: list[float] = field(default_factory=list)
    """Round trips of the background POSTs that ended while the probe ran."""
    lags: list[float] = field(default_factory=list)
    """Open loop: how long after its due time each send started, while the probe ran."""


@dataclass
class Load:
    process: mp.process.BaseProcess
    stop: EventType
    counters: LoadCounters
    report: LoadReport = field(default_factory=LoadReport)
    """Filled in when the load process has ended."""


@contextlib.contextmanager
def background(port: int, plan: LoadPlan | None, max_s: float) -> Iterator[Load | None]:
    if plan is None:
        yield None
        return
    context = mp.get_context("spawn")
    counters = LoadCounters(
        lines=context.Value("q", 0),
        requests=context.Value("q", 0),
        errors=context.Value("q", 0),
        streams_up=context.Value("q", 0),
        measuring=context.Value("b", 0),
        sends=context.Value("q", 0),
        missed=context.Value("q", 0),
        late=context.Value("q", 0),
    )
    stop = context.Event()
    report: mp.Queue[LoadReport] = context.Queue()
    process = context.Process(
        target=run_load, args=(plan, port, stop, max_s, counters, report), daemon=True
    )
    process.start()
    load = Load(process, stop, counters)
    try:
        deadline = time.monotonic() + 60
        while counters.streams_up.value < plan.streams:
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"load: only {counters.streams_up.value}/{plan.streams} streams got a 200"
                )
            time.sleep(0.05)
        yield load
    finally:
        stop.set()
        # Read before joining: the child cannot exit while its report still fills the pipe.
        with contextlib.suppress(queue.Empty):
            load.report = report.get(timeout=60)
        process.join(60)
        if process.is_alive():
            process.terminate()
            process.join(10)


# --- the probe ----------------------------------------------------------------------------


@dataclass
class Sample:
    post_s: float
    visible_s: float
    polls: int


def post_seconds(sample: Sample) -> float:
    return sample.post_s


def visible_seconds(sample: Sample) -> float:
    return sample.visible_s


MEASURES: tuple[tuple[str, Callable[[Sample], float]], ...] = (
    ("POST round trip", post_seconds),
    ("visible on GET", visible_seconds),
)


@dataclass
class Scenario:
    plan: LoadPlan | None
    """The background load; None for the idle peer."""
    samples: list[Sample] = field(default_factory=list)
    window_s: float = 0.0
    load_lines: int = 0
    load_requests: int = 0
    load_errors: int = 0
    load_sends: int = 0
    load_missed: int = 0
    load_late: int = 0
    load_failures: dict[str, int] = field(default_factory=dict)
    """Failed background requests by kind, over the whole run (settling included)."""
    load_latencies: list[float] = field(default_factory=list)
    load_lags: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    load_cpu_s: float = 0.0
    probe_cpu_s: float = 0.0
    other_cpu_s: float = 0.0
    """Everything else on the machine in the window (other users' processes included)."""

    @property
    def name(self) -> str:
        if self.plan is None:
            return "idle"
        if self.plan.rate is None:
            return f"{self.plan.streams} streams, closed loop"
        return f"{self.plan.streams} streams, {self.plan.rate:,.0f} lines/s"

    @property
    def slug(self) -> str:
        if self.plan is None:
            return "idle"
        rate = "closed" if self.plan.rate is None else f"{self.plan.rate:.0f}"
        return f"{self.plan.streams}x{rate}"

    def lines_per_s(self) -> float:
        return self.load_lines / self.window_s if self.window_s else 0.0


def is_decisive(found: list[dict[str, object]], node: str) -> str | None:
    for diagnosis in found:
        if diagnosis.get("action") == ACTION and diagnosis.get("culprit_nodes") == [node]:
            return str(diagnosis["id"])
    return None


async def one_sample(
    client: httpx.AsyncClient,
    job: str,
    node: str,
    body: bytes,
    poll_s: float,
    timeout_s: float,
) -> Sample:
    url = f"/v1/jobs/{job}/logs"
    started = time.perf_counter()
    post_done = 0.0

    async def post() -> httpx.Response:
        nonlocal post_done
        response = await client.post(
            url, params={"node": node}, content=body, headers={"Content-Type": "text/plain"}
        )
        post_done = time.perf_counter()
        return response

    posting = asyncio.create_task(post())
    polls = 0
    seen: str | None = None
    try:
        while seen is None:
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"{job}: no {ACTION} diagnosis on GET after {timeout_s} s")
            polled = time.perf_counter()
            answer = await client.get(f"/v1/jobs/{job}/diagnoses")
            polls += 1
            answer.raise_for_status()
            seen = is_decisive(answer.json()["diagnoses"], node)
            if seen is None:
                await asyncio.sleep(max(0.0, poll_s - (time.perf_counter() - polled)))
        visible = time.perf_counter() - started
        response = await posting
    finally:
        posting.cancel()
    if response.status_code != 200:
        raise RuntimeError(f"{job}: POST HTTP {response.status_code}: {response.text[:300]}")
    if response.json()["diagnoses"] != [seen]:
        raise RuntimeError(f"{job}: POST named {response.json()['diagnoses']}, GET {seen}")
    return Sample(post_done - started, visible, polls)


async def probe(
    base_url: str,
    scenario: Scenario,
    samples: int,
    warmup: int,
    prefix_kib: int,
    poll_s: float,
    timeout_s: float,
) -> None:
    rng = random.Random(23)
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        for i in range(warmup + samples):
            prefix, _ = benign_text(rng, prefix_kib * KIB, i * 1000)
            node = f"gpu-node-{i % 16:03d}"
            job = f"probe-{scenario.slug}-{i}"
            sample = await one_sample(
                client, job, node, (prefix + XID79).encode(), poll_s, timeout_s
            )
            if i >= warmup:
                scenario.samples.append(sample)
            await asyncio.sleep(rng.uniform(0.005, 0.02))


def window_counts(load: Load | None) -> tuple[int, ...]:
    """Lines, requests, errors, sends, missed and late so far: take two, subtract."""
    if load is None:
        return (0,) * 6
    c = load.counters
    return tuple(v.value for v in (c.lines, c.requests, c.errors, c.sends, c.missed, c.late))


def measure(args: argparse.Namespace, plan: LoadPlan | None, profile: Path | None) -> Scenario:
    scenario = Scenario(plan)
    budget = args.samples * args.timeout_s + 120
    with serve(profile) as server, background(server.port, plan, budget) as load:
        if load is not None:
            time.sleep(args.settle_s)  # past connection setup and first-request costs
        counts0 = window_counts(load)
        server0 = cpu_seconds(server.pid)
        load0 = cpu_seconds(load.process.pid) if load and load.process.pid else 0.0
        probe0, machine0 = own_cpu_seconds(), machine_busy_seconds()
        started = time.monotonic()
        if load is not None:
            load.counters.measuring.value = 1
        asyncio.run(
            probe(
                server.base_url,
                scenario,
                args.samples,
                args.warmup,
                args.prefix_kib,
                args.poll_ms / 1000,
                args.timeout_s,
            )
        )
        scenario.window_s = time.monotonic() - started
        if load is not None:
            load.counters.measuring.value = 0
        scenario.server_cpu_s = cpu_seconds(server.pid) - server0
        scenario.probe_cpu_s = own_cpu_seconds() - probe0
        if load is not None and load.process.pid:
            scenario.load_cpu_s = cpu_seconds(load.process.pid) - load0
            (
                scenario.load_lines,
                scenario.load_requests,
                scenario.load_errors,
                scenario.load_sends,
                scenario.load_missed,
                scenario.load_late,
            ) = (b - a for a, b in zip(counts0, window_counts(load), strict=True))
        scenario.other_cpu_s = max(
            0.0,
            machine_busy_seconds()
            - machine0
            - scenario.server_cpu_s
            - scenario.load_cpu_s
            - scenario.probe_cpu_s,
        )
    if load is not None:
        scenario.load_failures = load.report.failures
        scenario.load_latencies = load.report.latencies
        scenario.load_lags = load.report.lags
    return scenario


# --- the report ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the samples at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))
HEADERS = [
    "scenario",
    "measure",
    "samples",
    *(f"{name} ms" for name, _ in QUANTILES),
    "mean GETs / sample",
    "offered lines/s",
    "achieved lines/s",
    "background req/s",
    "sends late / missed",
    "background errors",
    "server CPU %",
    "load CPU %",
    "probe CPU %",
    "other CPU %",
]


def load_columns(scenario: Scenario) -> list[str]:
    """Offered and achieved load, sends late/missed and errors: the background's columns."""
    plan = scenario.plan
    if plan is None:
        return ["-"] * 5
    return [
        "closed loop" if plan.rate is None else f"{plan.rate:,.0f}",
        f"{scenario.lines_per_s():,.0f}",
        f"{scenario.load_requests / scenario.window_s:,.0f}",
        "-" if plan.rate is None else f"{scenario.load_late} / {scenario.load_missed}",
        str(scenario.load_errors),
    ]


def rows(scenarios: list[Scenario]) -> list[list[str]]:
    table: list[list[str]] = []
    for scenario in scenarios:
        measures = [(name, [pick(s) for s in scenario.samples]) for name, pick in MEASURES]
        if scenario.plan is not None and scenario.load_latencies:
            measures.append(
                (f"background POST (~{scenario.plan.body_kib} KiB)", scenario.load_latencies)
            )
        polls = sum(s.polls for s in scenario.samples) / len(scenario.samples)
        loaded = scenario.plan is not None
        for measure_name, values in measures:
            table.append(
                [
                    scenario.name,
                    measure_name,
                    str(len(values)),
                    *(f"{percentile(values, q) * 1000:.1f}" for _, q in QUANTILES),
                    f"{polls:.1f}" if measure_name in dict(MEASURES) else "-",
                    *load_columns(scenario),
                    f"{100 * scenario.server_cpu_s / scenario.window_s:.0f}",
                    f"{100 * scenario.load_cpu_s / scenario.window_s:.0f}" if loaded else "-",
                    f"{100 * scenario.probe_cpu_s / scenario.window_s:.0f}",
                    f"{100 * scenario.other_cpu_s / scenario.window_s:.0f}",
                ]
            )
    return table


RATIO_HEADERS = ["ratio", "measure", *(name for name, _ in QUANTILES)]


def ratio_rows(scenarios: list[Scenario]) -> list[list[str]]:
    """Every loaded scenario against the idle peer (the first scenario)."""
    idle = scenarios[0]
    out: list[list[str]] = []
    for loaded in scenarios[1:]:
        for name, pick in MEASURES:
            base = [pick(s) for s in idle.samples]
            load = [pick(s) for s in loaded.samples]
            out.append(
                [
                    f"{loaded.name} / idle",
                    name,
                    *(f"{percentile(load, q) / percentile(base, q):.1f}x" for _, q in QUANTILES),
                ]
            )
    return out


def schedule_notes(scenarios: list[Scenario]) -> list[str]:
    """How well each open-loop load kept to its schedule in the measurement window."""
    lines: list[str] = []
    for scenario in scenarios:
        plan = scenario.plan
        if plan is None or plan.rate is None:
            continue
        lags = scenario.load_lags or [0.0]
        lines.append(
            f"{scenario.name}: {scenario.load_sends:,} sends due in the window "
            f"({scenario.load_sends / scenario.window_s:,.0f}/s), "
            f"{scenario.load_late:,} late (started > {plan.late_s * 1000:g} ms after due), "
            f"{scenario.load_missed:,} missed ({plan.inflight} in flight on the stream); "
            f"start lag p50 {percentile(lags, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(lags, 0.99) * 1000:.1f} ms, max {max(lags) * 1000:.1f} ms; "
            f"achieved {scenario.lines_per_s() / plan.rate:.0%} of offered"
        )
    return lines


def verdicts(scenarios: list[Scenario]) -> list[str]:
    lines: list[str] = []
    for scenario in scenarios:
        if scenario.plan is None:
            continue
        p99 = percentile([s.visible_s for s in scenario.samples], 0.99) * 1000
        met = "met" if p99 < TARGET_P99_MS else "NOT met"
        lines.append(
            f"p99 time to visible on GET < {TARGET_P99_MS:.0f} ms under {scenario.name}: "
            f"{met} ({p99:.1f} ms)"
        )
    return lines


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return (
        f"{os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))}; {model}), "
        f"{pages / 2**30:.0f} GiB RAM, {platform.python_implementation()} "
        f"{platform.python_version()}, Linux {platform.release()}"
    )


def tree() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} with uncommitted changes" if git("status", "--porcelain") else head


def background_text(args: argparse.Namespace, scenarios: list[Scenario]) -> str:
    plans = [s.plan for s in scenarios if s.plan is not None]
    if not plans:
        return "Background: none."
    streams = plans[0].streams
    rates = [plan.rate for plan in plans if plan.rate is not None]
    text = (
        f"Background: a separate load process runs {streams} streams ({LOAD_JOBS} jobs x "
        f"{math.ceil(streams / LOAD_JOBS)} node/rank streams) POSTing ~{args.body_kib} KiB bodies "
        "of benign training-log lines (step/loss, NCCL INFO, warnings) on keep-alive "
        "connections during the whole measurement."
    )
    if any(plan.rate is None for plan in plans):
        text += (
            " `closed loop`: each stream sends its next body as soon as the previous response "
            "is in, which saturates the one worker: latency there is mostly queueing."
        )
    if rates:
        text += (
            f" Open loop (`--rates`, offered {', '.join(f'{r:,.0f}' for r in rates)} lines/s in "
            "total): each stream sends on a fixed schedule of offered / streams lines/s, start "
            "times spread evenly over one interval, each next send due at the previous due time "
            "+ that body's lines / the stream's rate, not waiting for responses; up to "
            f"{args.inflight} requests in flight per stream (one keep-alive connection each). A "
            "send due while all are busy is missed (skipped; the schedule goes on); one starting "
            f"more than {args.late_ms:g} ms after its due time is late. `achieved lines/s` counts "
            "the lines the server accepted in the measurement window."
        )
    return text


def markdown(args: argparse.Namespace, scenarios: list[Scenario], command: str) -> str:
    def table(header: list[str], body: list[list[str]]) -> list[str]:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in body),
        ]

    notes = schedule_notes(scenarios)
    text = [
        "## Time to diagnosis, rule path (`bench/diagnosis.py`)",
        "",
        f"Machine: {machine()}.",
        "",
        f"Command: `{command}`",
        "",
        f"Tree: {tree()}.",
        "",
        "Each scenario runs against a fresh `diagnoser serve` (one uvicorn worker, temp data dir, "
        "embedded SQLite, default settings). A sample is a fresh job: one `text/plain` POST of "
        f"~{args.prefix_kib} KiB of benign lines followed by `NVRM: Xid ... 79, GPU has fallen "
        "off the bus`; from the moment the POST is sent, a poller on its own connection GETs "
        f"`/v1/jobs/{{job}}/diagnoses` every {args.poll_ms:g} ms until the "
        "`cordon_node_and_restart` diagnosis naming the node appears. `POST round trip` is the "
        "decisive POST's response time; `visible on GET` is from sending the POST to the end of "
        "the first GET that returned the diagnosis (the POST's `diagnoses` must name the same id); "
        "`background POST` is the round trip of the load's own benign POSTs in the same window. "
        f"{args.samples} samples per scenario after {args.warmup} warm-up samples, one at a time "
        f"with 5-20 ms between them. {background_text(args, scenarios)} The idle scenario is "
        "the peer. CPU % is over the measurement window (100 = one core); the "
        "server, the load process and the probe share the machine's cores, and `other CPU %` is "
        "everything else on the machine in that window (other people's work included): a "
        "warning sign for every column.",
        "",
        *table(HEADERS, rows(scenarios)),
        "",
        *table(RATIO_HEADERS, ratio_rows(scenarios)),
        "",
        *([*(f"- {line}" for line in notes), ""] if notes else []),
        *(
            f"Background failures over the whole {s.name} run, by kind: "
            + ", ".join(f"{kind} x{n}" for kind, n in sorted(s.load_failures.items()))
            + ".\n"
            for s in scenarios
            if s.load_failures
        ),
        "Target:",
        "",
        *(f"- {line}" for line in verdicts(scenarios)),
        "",
    ]
    return "\n".join(text)


def print_report(console: Console, scenarios: list[Scenario]) -> None:
    table = Table(title="time to diagnosis (rule path)")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in {"scenario", "measure"} else "right")
    for row in rows(scenarios):
        table.add_row(*row)
    console.print(table)
    ratios = Table(title="loaded / idle")
    for header in RATIO_HEADERS:
        ratios.add_column(header)
    for row in ratio_rows(scenarios):
        ratios.add_row(*row)
    console.print(ratios)
    for line in schedule_notes(scenarios):
        console.print(line)
    for line in verdicts(scenarios):
        console.print(line)


def print_profile(console: Console, path: Path, top: int) -> None:
    console.print(f"\nserver profile ({path}), main thread, top {top} by own time:")
    stats = pstats.Stats(str(path))
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    stats.sort_stats(pstats.SortKey.CUMULATIVE).print_stats(top)


def rate(text: str) -> float:
    value = float(text.replace("_", ""))
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive rate: {text!r}")
    return value


def rate_list(text: str) -> list[float]:
    return [rate(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--streams", type=int, default=64, help="background streams")
    parser.add_argument("--body-kib", type=int, default=64, help="background body size")
    parser.add_argument(
        "--rate",
        dest="rates",
        type=rate,
        action="append",
        metavar="LINES_PER_S",
        help="open loop: total background lines/s over all streams (one scenario; repeatable)",
    )
    parser.add_argument(
        "--rates",
        dest="rates",
        type=rate_list,
        action="extend",
        metavar="R1,R2,...",
        help="open loop: one scenario per total background rate, in lines/s",
    )
    parser.add_argument(
        "--closed-loop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the closed-loop scenario (back-to-back POSTs; the only loaded one "
        "when no rate is given)",
    )
    parser.add_argument(
        "--inflight", type=int, default=4, help="open loop: requests in flight per stream, at most"
    )
    parser.add_argument(
        "--late-ms", type=float, default=10.0, help="open loop: a send this late counts as late"
    )
    parser.add_argument("--prefix-kib", type=int, default=16, help="benign lines before the Xid")
    parser.add_argument("--poll-ms", type=float, default=2.0)
    parser.add_argument("--timeout-s", type=float, default=10.0, help="per sample")
    parser.add_argument("--settle-s", type=float, default=2.0, help="load before measuring")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the last loaded scenario's server under cProfile, stats here",
    )
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    args.rates = args.rates or []
    if args.samples < 1 or args.streams < 1 or args.inflight < 1 or args.body_kib < 1:
        parser.error("--samples, --streams, --inflight and --body-kib must be at least 1")
    if not args.rates and not args.closed_loop:
        parser.error("--no-closed-loop needs at least one --rate")
    return args


def plans(args: argparse.Namespace) -> list[LoadPlan | None]:
    """The idle peer, each open-loop rate as given, then the closed loop."""
    rates: list[float | None] = [*args.rates, *([None] if args.closed_loop else [])]
    return [
        None,
        *(
            LoadPlan(args.streams, args.body_kib, r, args.inflight, args.late_ms / 1000)
            for r in rates
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", "bench/diagnosis.py", *sys.argv[1:]])
    console = Console(width=260)
    scenarios: list[Scenario] = []
    planned = plans(args)
    for i, plan in enumerate(planned):
        console.print(f"measuring {Scenario(plan).name} ...")
        profile = args.profile if i == len(planned) - 1 else None
        scenarios.append(measure(args, plan, profile))
    print_report(console, scenarios)
    if args.profile is not None:
        print_profile(console, args.profile, 30)
    if not args.no_write:
        RESULTS.write_text(markdown(args, scenarios, command))
        console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
