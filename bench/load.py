"""Cluster-sized load: M nodes streaming at once, a failure storm, and the count check.

    python bench/load.py                                    # embedded, 1 and 2 replicas, ~10 min
    python bench/load.py --modes embedded --nodes 2000 --seconds 30
    python bench/load.py --modes postgres2 --ramp 5000,10000,20000,40000 --step-seconds 15
    python bench/load.py --modes postgres --soak-minutes 10        # RSS over a long run

Loopback only, bounded in time. Per mode (`--modes`):

* `embedded`: one `diagnoser serve` on its embedded SQLite (the default deployment);
* `postgres`: one replica on a throwaway PostgreSQL cluster and Redis (started as the suite
  starts them, migrated);
* `postgres2`: two replicas on the same PostgreSQL and Redis. No load balancer: node i talks
  to replica i mod 2, as a Kubernetes Service would spread connections.

Every mode is protected as a real deployment is: an admin token from `diagnoser token create`
(the CLI writes the database directly), then over HTTP one `ingest` token bound to each node
(`POST /v1/tokens`), a `read` token for the poller and an `operator` token for the claimer.
Actions are released (`DIAGNOSER_ACTIONS__DRY_RUN=false`), so the cordon reaches the queue.

The driver simulates M nodes (`--nodes`) in jobs of `--job-nodes` nodes, each node with
`--ranks` ranks and ONE keep-alive connection that multiplexes them: the node's stream is one
`text/plain` byte stream whose lines carry torchrun's `[rankN]:` prefix, as `diagnoser ship`
sends a node's launcher log, at `--rate` lines/s per node. `--wire chunked` (the default) is
the shipper's wire: a chunked upload from the committed offset (`?offset=`) that stays open
up to `--request-s` s with one chunk every `--interval` s, its length drawn as the shipper
draws it (the first a random share of `--request-s`, later ones in its last
`--request-spread`; `--in-step` holds every upload open exactly `--request-s`, as shippers did
before, so a fleet started together ends its uploads together); `--wire requests` sends one
POST per interval instead. Whatever the server has not acknowledged is sent again from its committed
offset, so a slow server shows up as lower achieved lines/s and longer latencies, never as
lost lines. Lines are benign training output (progress, NCCL INFO, allocator and deprecation
warnings). The client speaks HTTP/1.1 over asyncio streams with pre-encoded heads: httpx with
hundreds of connections in one pool costs about 75x more client CPU per request (measured,
BENCHMARKS.md), and the driver shares the cores with the server.

Phases: warm-up (every node's first send, then `--warmup-s`), steady (`--seconds`, or
`--soak-minutes`), after an optional ramp (`--ramp` total lines/s steps of `--step-seconds`
each); then the storm in job 0: node `--fault-node` writes `NVRM: Xid ... 79, GPU has fallen
off the bus`, and `--storm-delay-s` later every rank of every node of the job prints a
DistBackendError traceback and the job's nodes go quiet (the other jobs keep streaming).
Measured from the send of the chunk carrying the Xid line: the correct diagnosis
(`cordon_node_and_restart`, culprit the fault node) on `GET /v1/jobs/{job}/diagnoses` (polled
every 50 ms), and its `cordon_node` action from a long-polling `POST /v1/actions/claim`. Then
every node sends its backlog (for at most `--drain-timeout-s`) and the count check asks each
stream's committed lines and offset (`GET .../logs`).

Reported per mode: offered and achieved lines/s (the servers' `diagnoser_ingest_lines`),
upload p50/p99 (last chunk to answer), errors by kind, fault to diagnosis and to action,
cordons of the job (must be one, of the fault node), diagnoses on healthy jobs (must be none),
CPU seconds and peak RSS per replica (from /proc) with RSS by minute (a soak's growth), and the
streams whose committed lines or bytes differ from what the driver sent (must be none). The
peer column is the embedded mode (ratios to it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from processes import (
    cpu_seconds,
    free_port,
    machine_busy_seconds,
    percentile,
    rss_bytes,
    wait_for_health,
)
from rich.console import Console
from rich.table import Table
from training_log import benign_line

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
"""The suite's PostgreSQL and Redis servers live in tests/servers.py."""

MODES = ("embedded", "postgres", "postgres2")
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
ACTION = "cordon_node_and_restart"
POOL_LINES = 2048
"""Benign lines per rank, generated once and cycled (cheap for the driver, varied enough)."""
TARGET_P99_S = 0.100
PROGRESS_S = 5.0
REQUEST_TIMEOUT_S = 30.0
OUTCOME_TIMEOUT_S = 180.0
"""For the checks after the run: an overloaded replica answers late, and is still asked."""
TARGET_DIAGNOSIS_S = 5.0
RAISED = {
    # 512 by default: 2,000 nodes with a few hundred ms of queueing would meet 429s.
    "DIAGNOSER_INGEST__MAX_CONCURRENT_REQUESTS": "8192",
    # 4,096 by default: enough for 2,000 nodes, not for the 4,000 of a ramp.
    "DIAGNOSER_LIMITS__MAX_CONNECTIONS": "8192",
    # 10 by default (PostgreSQL only): one commit per POST from thousands of nodes.
    "DIAGNOSER_DB__POOL_SIZE": "20",
}
"""Settings raised for the run so that no admission limit caps what is measured."""
JsonObject = dict[str, Any]


# --- the services -------------------------------------------------------------------------


@dataclass
class Replica:
    base_url: str
    process: subprocess.Popen[bytes]
    log: Path
    database: str = ""
    """The PostgreSQL URL, or the embedded data directory."""
    cpu_start: float = 0.0
    rss_peak: int = 0
    rss_samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def sample(self, now: float) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            rss = rss_bytes(self.process.pid)
            self.rss_peak = max(self.rss_peak, rss)
            self.rss_samples.append((now, rss))

    def cpu(self) -> float:
        try:
            return cpu_seconds(self.process.pid) - self.cpu_start
        except OSError:
            return float("nan")


def raise_fd_limit() -> None:
    """Thousands of sockets on both sides: the soft limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def service_env(data: str, database_url: str | None, redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env |= {
        "DIAGNOSER_DATA_DIR": data,
        "DIAGNOSER_RULES_WATCH": "false",
        "DIAGNOSER_ACTIONS__DRY_RUN": "false",
        "DIAGNOSER_LOG_LEVEL": "warning",
        **RAISED,
    }
    if database_url is not None:
        env["DIAGNOSER_DB__URL"] = database_url
    if redis_url is not None:
        env["DIAGNOSER_REDIS__URL"] = redis_url
    return env


def admin_token(env: dict[str, str]) -> str:
    """What an operator does first: `diagnoser token create --role admin` on the database."""
    done = subprocess.run(
        [sys.executable, "-m", "diagnoser", "token", "create", "--role", "admin",
         "--description", "bench/load.py"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def backing(mode: str) -> Iterator[tuple[str | None, str | None]]:
    """(database URL, Redis URL): none for embedded, a throwaway PostgreSQL and Redis else."""
    if mode == "embedded":
        yield None, None
        return
    from diagnoser.store.database import parse_database_url
    from diagnoser.store.migrate import upgrade
    from tests.servers import PostgresServer, RedisServer

    postgres, redis_server = PostgresServer(), RedisServer()
    try:
        postgres.init()
        postgres.start()
        redis_server.start()
        database = postgres.create_database()
        upgrade(parse_database_url(database))
        yield database, redis_server.url
    finally:
        redis_server.stop()
        postgres.destroy()


@contextlib.contextmanager
def services(
    mode: str, profile: Path | None = None, logs: Path | None = None
) -> Iterator[tuple[list[Replica], str]]:
    """The mode's replicas, up and healthy, and an admin token."""
    replicas_wanted = 2 if mode == "postgres2" else 1
    with (
        backing(mode) as (database_url, redis_url),
        tempfile.TemporaryDirectory(prefix="bench-load-") as data,
    ):
        env = service_env(data, database_url, redis_url)
        token = admin_token(env)
        replicas: list[Replica] = []
        try:
            for index in range(replicas_wanted):
                port = free_port()
                log = Path(data) / f"serve-{index}.log"
                command = [sys.executable, "-m", "diagnoser", "serve", "--port", str(port)]
                if profile is not None and index == 0:
                    command[1:1] = ["-m", "cProfile", "-o", str(profile)]
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        command,
                        env=env, stdout=out, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                replicas.append(
                    Replica(f"http://127.0.0.1:{port}", process, log, database_url or data)
                )
            for replica in replicas:
                wait_for_health(replica.process, replica.base_url, replica.log, timeout_s=90)
            yield replicas, token
        finally:
            for replica in replicas:
                replica.process.terminate()
            for index, replica in enumerate(replicas):
                try:
                    replica.process.wait(30)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                if logs is not None:
                    logs.mkdir(parents=True, exist_ok=True)
                    shutil.copy(replica.log, logs / f"{mode}-serve-{index}.log")


# --- the nodes ----------------------------------------------------------------------------


def storm_lines(rank: int) -> list[bytes]:
    """What each rank prints when its collective fails because a peer's GPU is gone."""
    prefix = f"[rank{rank}]: "
    text = [
        "Traceback (most recent call last):",
        '  File "/workspace/megatron/pretrain_gpt.py", line 412, in <module>',
        "    pretrain(train_valid_test_datasets_provider, model_provider)",
        '  File "/workspace/megatron/training.py", line 1216, in train_step',
        "    losses_reduced = forward_backward_func(",
        '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", '
        "line 79, in wrapper",
        "    return func(*args, **kwargs)",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.20.5",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed "
        "or device error.",
    ]
    return [(prefix + line + "\n").encode() for line in text]


@dataclass
class Counters:
    """What the whole driver sent and saw; latencies are kept only while measuring."""

    measuring: bool = False
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    acked_lines: int = 0
    requests: int = 0
    step_latencies: list[float] = field(default_factory=list)
    step_acked: int = 0


@dataclass
class Node:
    """One node: its ranks' lines as one byte stream, and what the server has acknowledged."""

    name: str
    job: str
    index: int
    first_rank: int
    ranks: int
    replica: Replica
    token: str
    rate: float
    pool: list[list[bytes]]
    generated_lines: int = 0
    generated_bytes: int = 0
    acked_offset: int = 0
    pending: bytearray = field(default_factory=bytearray)
    pending_lines: list[int] = field(default_factory=list)
    """Byte end of each pending line (stream offsets), to count what an ack covers."""
    carry: float = 0.0
    quiet: bool = False
    inject: list[bytes] = field(default_factory=list)
    """Lines to append before the next POST (the fault, the storm)."""
    timing_fault: bool = False
    fault_sent_at: float | None = None
    """When the first POST carrying the fault line was sent (perf_counter)."""
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    last_produced: float = 0.0
    phased: bool = False
    """Whether the node's uploads have their random phase (`Wire.upload_s`)."""

    def append(self, line: bytes) -> None:
        self.pending += line
        self.generated_bytes += len(line)
        self.generated_lines += 1
        self.pending_lines.append(self.generated_bytes)

    def produce(self, seconds: float) -> None:
        """The lines the ranks printed in the last `seconds`, round robin over the ranks."""
        if self.quiet:
            return
        self.carry += self.rate * seconds
        count = int(self.carry)
        self.carry -= count
        for _ in range(count):
            n = self.generated_lines
            self.append(self.pool[n % self.ranks][(n // self.ranks + self.index) % POOL_LINES])

    def lines_up_to(self, offset: int) -> int | None:
        """How many lines the driver wrote that end at or before `offset`; None when the
        offset is not a line end it wrote (or is short of what the server acknowledged)."""
        acked = self.generated_lines - len(self.pending_lines)
        if offset == self.acked_offset:
            return acked
        index = bisect.bisect_left(self.pending_lines, offset)
        if index == len(self.pending_lines) or self.pending_lines[index] != offset:
            return None
        return acked + index + 1

    def acknowledge(self, next_offset: int) -> int:
        """Drop what the server committed; the number of lines that were."""
        if next_offset <= self.acked_offset:
            return 0
        del self.pending[: next_offset - self.acked_offset]
        self.acked_offset = next_offset
        done = 0
        while done < len(self.pending_lines) and self.pending_lines[done] <= next_offset:
            done += 1
        del self.pending_lines[:done]
        return done


LOSS = re.compile(r"loss=[0-9.]+")


def make_pool(ranks: int, seed: int) -> list[list[bytes]]:
    """Per local rank, POOL_LINES benign lines with that rank's torchrun prefix.

    The loss falls slowly with 1 % noise, as a healthy run's does: the generator's uniform
    1.5-3.0 losses are noise enough to trip the loss-spike signal now and then.
    """
    rng = random.Random(seed)
    lines = [
        LOSS.sub(f"loss={2.4 - n / POOL_LINES * 0.2 + rng.gauss(0, 0.02):.4f}", benign_line(rng, n))
        for n in range(POOL_LINES)
    ]
    return [[f"[rank{r}]: {line}\n".encode() for line in lines] for r in range(ranks)]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the connection stays open (uvicorn always sends a length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *headers = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    length, keep = 0, True
    for header in headers:
        name, _, value = header.partition(":")
        lowered = name.strip().lower()
        if lowered == "content-length":
            length = int(value)
        elif lowered == "connection" and value.strip().lower() == "close":
            keep = False
    return status, await reader.readexactly(length), keep


async def post_once(node: Node, counters: Counters) -> None:
    """One POST of everything pending, from the committed offset; bookkeeping of the answer."""
    body = bytes(node.pending)
    head = (
        f"POST /v1/jobs/{node.job}/logs?node={node.name}&offset={node.acked_offset} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{node.replica.port}\r\nAuthorization: Bearer {node.token}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    if node.timing_fault and node.fault_sent_at is None:
        node.fault_sent_at = started
    try:
        if node.connection is None:
            node.connection = await asyncio.open_connection("127.0.0.1", node.replica.port)
        reader, writer = node.connection
        writer.write(head + body)
        await writer.drain()
        status, answer, keep = await asyncio.wait_for(read_response(reader), REQUEST_TIMEOUT_S)
    except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
        counters.failures[type(exc).__name__] += 1
        if node.connection is not None:
            node.connection[1].close()
        node.connection = None
        return
    settle(node, counters, status, answer, keep, time.perf_counter() - started)


def settle(
    node: Node, counters: Counters, status: int, answer: bytes, keep: bool, elapsed: float
) -> None:
    """The answer to one upload: what it committed, or why not."""
    if not keep and node.connection is not None:
        node.connection[1].close()
        node.connection = None
    counters.requests += 1
    if status == 409:
        # The server has less than we think (cannot happen without a crash): resend from there.
        counters.failures["HTTP 409"] += 1
        return
    if status != 200:
        counters.failures[f"HTTP {status}"] += 1
        return
    lines = node.acknowledge(int(json.loads(answer)["next_offset"]))
    counters.acked_lines += lines
    if counters.measuring:
        counters.latencies.append(elapsed)
        counters.step_latencies.append(elapsed)
        counters.step_acked += lines


@dataclass(frozen=True)
class Wire:
    """How nodes send: `chunked` holds one upload open for `request_s` and writes a chunk every
    `interval` (what `diagnoser ship` does); `requests` sends one POST per interval."""

    kind: str
    interval: float
    request_s: float
    spread: float | None = 0.1
    """As `diagnoser ship` draws each upload's length (`Shipper._request_seconds`): the first
    after a start or a failure a random share of `request_s`, each later one in its last
    `spread`; None: every upload lasts `request_s`, as shippers did before (in step)."""
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def upload_s(self, node: Node) -> float:
        if self.spread is None:
            return self.request_s
        if not node.phased:
            node.phased = True
            return self.request_s * self.rng.uniform(0.1, 1.0)
        return self.request_s * self.rng.uniform(1.0 - self.spread, 1.0)


async def run_node(node: Node, counters: Counters, wire: Wire, stop: asyncio.Event) -> None:
    """Until `stop`, then until nothing is pending (or the drain is cut short)."""
    # The first sends spread over an interval, as nodes that started at different times.
    await asyncio.sleep(wire.interval * (node.index % 97) / 97)
    node.last_produced = time.perf_counter()
    while True:
        if wire.kind == "chunked" and not stop.is_set():
            await chunked_upload(node, counters, wire, stop)
            continue
        due = time.perf_counter() + (wire.interval if not stop.is_set() else 0.05)
        tick(node, stop)
        if node.pending:
            await post_once(node, counters)
        elif stop.is_set():
            break
        left = due - time.perf_counter()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), left)
    if node.connection is not None:
        node.connection[1].close()
        node.connection = None


def tick(node: Node, stop: asyncio.Event) -> None:
    """The lines printed since the last tick, and any injected ones, join what is pending."""
    now = time.perf_counter()
    if not stop.is_set():
        node.produce(now - node.last_produced)
    node.last_produced = now
    if node.inject:
        lines, node.inject = node.inject, []
        for line in lines:
            node.append(line)


async def chunked_upload(node: Node, counters: Counters, wire: Wire, stop: asyncio.Event) -> None:
    """One long upload from the committed offset: a chunk per interval, then the end, then the
    answer. Latency is from the last chunk (the terminator) to the answer."""
    head = (
        f"POST /v1/jobs/{node.job}/logs?node={node.name}&offset={node.acked_offset} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{node.replica.port}\r\nAuthorization: Bearer {node.token}\r\n"
        f"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    written = 0
    ends = time.perf_counter() + wire.upload_s(node)
    try:
        if node.connection is None:
            node.connection = await asyncio.open_connection("127.0.0.1", node.replica.port)
        reader, writer = node.connection
        writer.write(head)
        while True:
            tick(node, stop)
            if len(node.pending) > written:
                if node.timing_fault and node.fault_sent_at is None:
                    node.fault_sent_at = time.perf_counter()
                chunk = bytes(node.pending[written:])
                writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                written = len(node.pending)
                await writer.drain()
            left = min(wire.interval, ends - time.perf_counter())
            if stop.is_set() or left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), left)
        writer.write(b"0\r\n\r\n")
        started = time.perf_counter()
        await writer.drain()
        status, answer, keep = await asyncio.wait_for(read_response(reader), REQUEST_TIMEOUT_S)
    except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
        counters.failures[type(exc).__name__] += 1
        if node.connection is not None:
            node.connection[1].close()
        node.connection = None
        node.phased = False  # as the shipper after a failure: a new random phase
        await asyncio.sleep(wire.interval)  # the shipper backs off, then resumes from the offset
        return
    settle(node, counters, status, answer, keep, time.perf_counter() - started)


# --- one mode -----------------------------------------------------------------------------


@dataclass
class Step:
    offered: float
    seconds: float
    achieved: float
    p50: float
    p99: float
    errors: int


@dataclass
class Result:
    mode: str
    nodes: int
    fault_node: str = ""
    offered: float = 0.0
    achieved: float = 0.0
    p50: float = float("nan")
    p99: float = float("nan")
    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    fault_to_diagnosis: float | None = None
    fault_to_action: float | None = None
    fault_post_s: float | None = None
    cordons: list[str] = field(default_factory=list)
    storm_diagnoses: list[str] = field(default_factory=list)
    healthy_diagnoses: int = 0
    healthy_examples: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss_peak: list[int] = field(default_factory=list)
    rss_by_minute: list[list[int]] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    """Streams whose committed lines differ from what the driver wrote up to their offset."""
    undrained: int = 0
    """Streams the driver could not empty before the drain timeout (lines still unsent)."""
    unsent_lines: int = 0
    acked_lines: int = 0
    streams: int = 0
    sent_lines: int = 0
    committed_lines: int = 0
    steps: list[Step] = field(default_factory=list)
    driver_cpu: float = 0.0
    machine_cpu: float = 0.0
    wall: float = 0.0
    database_growth: int = 0
    """Bytes the database grew by over the run (SQLite: its files; PostgreSQL: its size)."""


async def create_tokens(
    replica: Replica, admin: str, nodes: list[str]
) -> tuple[dict[str, str], str, str]:
    """Each node's bound ingest token, a read token and an operator token, over HTTP."""
    headers = {"Authorization": f"Bearer {admin}"}
    async with httpx.AsyncClient(base_url=replica.base_url, headers=headers, timeout=60) as http:

        async def make(body: JsonObject) -> str:
            response = await http.post("/v1/tokens", json=body)
            response.raise_for_status()
            return str(response.json()["token"])

        bound: dict[str, str] = {}
        for start in range(0, len(nodes), 50):
            chunk = nodes[start : start + 50]
            made = await asyncio.gather(*(make({"role": "ingest", "node": n}) for n in chunk))
            bound.update(zip(chunk, made, strict=True))
        return bound, await make({"role": "read"}), await make({"role": "operator"})


async def watch_diagnosis(
    base_url: str, token: str, job: str, node: str, deadline: float
) -> tuple[float, str] | None:
    """When the correct diagnosis is first visible on GET (perf_counter), and its id."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        while time.perf_counter() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                response = await http.get(f"/v1/jobs/{job}/diagnoses")
                for diagnosis in response.json().get("diagnoses", []):
                    if diagnosis["action"] == ACTION and diagnosis["culprit_nodes"] == [node]:
                        return time.perf_counter(), str(diagnosis["id"])
            await asyncio.sleep(0.05)
    return None


async def watch_action(
    base_url: str, token: str, node: str, deadline: float
) -> tuple[float, list[str]] | None:
    """When a long-polling claimer receives the node's cordon; every cordon it received."""
    headers = {"Authorization": f"Bearer {token}"}
    seen: list[str] = []
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as http:
        while (left := deadline - time.perf_counter()) > 0:
            body = {
                "operator_id": "bench-load",
                "max": 10,
                "kinds": ["cordon_node"],
                "lease_seconds": 300,
                "wait_seconds": max(0, min(10, int(left))),
            }
            try:
                response = await http.post("/v1/actions/claim", json=body)
                response.raise_for_status()
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
                continue
            found = None
            for action in response.json()["actions"]:
                seen.append(str(action["target"].get("node")))
                await http.post(
                    f"/v1/actions/{action['id']}/complete",
                    json={"operator_id": "bench-load", "status": "done", "message": "bench"},
                )
                if action["target"].get("node") == node:
                    found = time.perf_counter()
            if found is not None:
                return found, seen
    return None


async def framed_lines(replicas: list[Replica], token: str) -> int | None:
    """Lines the replicas framed so far (`diagnoser_ingest_lines` on /metrics): the server's
    own count, so throughput is measured where it happens, whatever the wire. None when a
    replica is too busy to answer within a minute."""
    total = 0
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        for replica in replicas:
            try:
                text = (await http.get(f"{replica.base_url}/metrics")).text
            except httpx.HTTPError:
                return None
            for line in text.splitlines():
                if line.startswith("diagnoser_ingest_lines") and not line.startswith(
                    "diagnoser_ingest_lines_created"
                ):
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def sample_rss(
    replicas: list[Replica], nodes: list[Node], counters: Counters, stop: asyncio.Event
) -> None:
    """RSS twice a second; every PROGRESS_S a line of progress (lines acked, backlog)."""
    last_at, last_acked = time.perf_counter(), 0
    while not stop.is_set():
        now = time.perf_counter()
        for replica in replicas:
            replica.sample(now)
        if now - last_at >= PROGRESS_S:
            backlog = sum(len(n.pending_lines) for n in nodes)
            rate = (counters.acked_lines - last_acked) / (now - last_at)
            console_line(
                f"  {rate:,.0f} lines/s acked, {counters.requests:,} requests, backlog "
                f"{backlog:,} lines, errors {dict(counters.failures) or 0}, RSS "
                + mib([r.rss_peak for r in replicas])
                + " MiB"
            )
            last_at, last_acked = now, counters.acked_lines
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def count_check(
    replicas: list[Replica], nodes: list[Node], token: str, result: Result
) -> None:
    """Each stream's committed lines and offset against what the driver generated."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=OUTCOME_TIMEOUT_S) as http:

        async def one(node: Node) -> None:
            url = f"{replicas[0].base_url}/v1/jobs/{node.job}/logs"
            try:
                response = await http.get(url, params={"node": node.name})
            except httpx.HTTPError as exc:
                result.mismatched.append(f"{node.job}/{node.name}: no answer ({exc!r})")
                return
            if response.status_code == 404 and node.acked_offset == 0:
                lines, offset = 0, 0  # no upload of this node ever got through: nothing committed
            elif response.status_code != 200:
                result.mismatched.append(f"{node.job}/{node.name}: HTTP {response.status_code}")
                return
            else:
                status = response.json()
                lines, offset = int(status["lines"]), int(status["committed_offset"])
            result.committed_lines += lines
            if node.pending:
                result.undrained += 1
                result.unsent_lines += len(node.pending_lines)
            expected = node.lines_up_to(offset)
            if expected is None or lines != expected:
                result.mismatched.append(
                    f"{node.job}/{node.name}: committed {lines} lines {offset} B; the driver "
                    f"wrote {expected} lines up to that offset ({node.generated_lines} lines "
                    f"{node.generated_bytes} B in all)"
                )

        for start in range(0, len(nodes), 100):
            await asyncio.gather(*(one(n) for n in nodes[start : start + 100]))
    result.streams = len(nodes)
    result.sent_lines = sum(n.generated_lines for n in nodes)
    result.acked_lines = sum(n.generated_lines - len(n.pending_lines) for n in nodes)


def make_nodes(
    args: argparse.Namespace, replicas: list[Replica], tokens: dict[str, str]
) -> list[Node]:
    """Jobs of `--job-nodes` nodes; node i on replica i mod N."""
    pool = make_pool(args.ranks, args.seed)
    return [
        Node(
            name=name,
            job=f"load-job-{i // args.job_nodes:03d}",
            index=i,
            first_rank=(i % args.job_nodes) * args.ranks,
            ranks=args.ranks,
            replica=replicas[i % len(replicas)],
            token=tokens[name],
            rate=args.rate,
            pool=pool,
        )
        for i, name in enumerate(tokens)
    ]


async def run_storm(
    args: argparse.Namespace,
    replicas: list[Replica],
    tokens: tuple[str, str],
    storm_nodes: list[Node],
    fault: Node,
    result: Result,
) -> None:
    """The Xid line on one node, then a traceback on every rank of the job; timed."""
    read_token, operator_token = tokens
    deadline = time.perf_counter() + args.storm_timeout_s
    diagnosis = asyncio.create_task(
        watch_diagnosis(replicas[0].base_url, read_token, fault.job, fault.name, deadline)
    )
    action = asyncio.create_task(
        watch_action(replicas[-1].base_url, operator_token, fault.name, deadline)
    )
    await asyncio.sleep(0.2)  # both watchers are listening
    fault.timing_fault = True
    fault.inject = [XID79.encode()]  # the kernel's line: no rank prefix
    await asyncio.sleep(args.storm_delay_s)
    for node in storm_nodes:
        node.quiet = True
        node.inject += [
            line
            for rank in range(node.first_rank, node.first_rank + node.ranks)
            for line in storm_lines(rank)
        ]
    found_diagnosis, found_action = await diagnosis, await action
    fault_sent = fault.fault_sent_at
    if found_diagnosis is not None and fault_sent is not None:
        result.fault_to_diagnosis = found_diagnosis[0] - fault_sent
    if found_action is not None and fault_sent is not None:
        result.fault_to_action = found_action[0] - fault_sent


@dataclass
class Meter:
    """Measurement windows: latencies of the window, errors, lines/s the servers framed."""

    counters: Counters
    replicas: list[Replica]
    token: str

    async def measure(self, seconds: float) -> tuple[float, int, float]:
        """Elapsed s, errors, and lines/s the servers framed in the window."""
        counters = self.counters
        counters.measuring = True
        counters.step_latencies, counters.step_acked = [], 0
        errors = sum(counters.failures.values())
        before = await framed_lines(self.replicas, self.token)
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        after = await framed_lines(self.replicas, self.token)
        elapsed = time.perf_counter() - started
        counters.measuring = False
        if before is None or after is None:
            console_line("  /metrics did not answer: lines/s from the acknowledgements instead")
            framed = counters.step_acked
        else:
            framed = after - before
        return elapsed, sum(counters.failures.values()) - errors, framed / elapsed


def set_rate(nodes: list[Node], total: float) -> None:
    healthy = [n for n in nodes if not n.quiet]
    for node in healthy:
        node.rate = total / len(healthy)


async def run_ramp(
    args: argparse.Namespace, nodes: list[Node], meter: Meter, result: Result
) -> None:
    """Each `--ramp` total rate for `--step-seconds`; then back to the steady rate."""
    for offered in args.ramp:
        set_rate(nodes, offered)
        await asyncio.sleep(args.interval)  # the new rate's first sends
        elapsed, errors, achieved = await meter.measure(args.step_seconds)
        latencies = meter.counters.step_latencies
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        result.steps.append(Step(offered, elapsed, achieved, p50, p99, errors))
        console_line(f"  {result.mode} ramp {offered:,.0f} lines/s: {result.steps[-1]}")
    set_rate(nodes, args.rate * args.nodes)


async def run_mode(
    args: argparse.Namespace, mode: str, replicas: list[Replica], admin: str
) -> Result:
    result = Result(mode, args.nodes, offered=args.rate * args.nodes)
    names = [f"gpu-node-{i:04d}" for i in range(args.nodes)]
    tokens, read_token, operator_token = await create_tokens(replicas[0], admin, names)
    nodes = make_nodes(args, replicas, tokens)
    storm_nodes = [n for n in nodes if n.job == nodes[0].job]
    fault = storm_nodes[min(args.fault_node, len(storm_nodes) - 1)]
    result.fault_node = fault.name
    counters = Counters()
    database_start = database_bytes(replicas[0].database)
    meter = Meter(counters, replicas, read_token)
    stop, sampling = asyncio.Event(), asyncio.Event()
    for replica in replicas:
        replica.cpu_start = cpu_seconds(replica.process.pid)
    driver_start = os.times().user + os.times().system
    machine_start, wall_start = machine_busy_seconds(), time.perf_counter()
    sampler = asyncio.create_task(sample_rss(replicas, nodes, counters, sampling))
    spread = None if args.in_step else args.request_spread
    wire = Wire(args.wire, args.interval, args.request_s, spread, random.Random(args.seed))
    tasks = [asyncio.create_task(run_node(n, counters, wire, stop)) for n in nodes]
    await asyncio.sleep(args.interval + args.warmup_s)
    if args.ramp:
        await run_ramp(args, nodes, meter, result)
    counters.latencies = []
    _, _, result.achieved = await meter.measure(
        args.soak_minutes * 60 if args.soak_minutes else args.seconds
    )
    result.p50 = percentile(counters.latencies, 0.5)
    result.p99 = percentile(counters.latencies, 0.99)
    steady_samples = [r.rss_samples[:] for r in replicas]
    await run_storm(args, replicas, (read_token, operator_token), storm_nodes, fault, result)
    await asyncio.sleep(args.settle_s)  # let the storm's last lines land before counting
    stop.set()
    _, late = await asyncio.wait(tasks, timeout=args.drain_timeout_s)
    for task in late:  # the count check names their streams
        task.cancel()
    sampling.set()
    await sampler
    result.wall = time.perf_counter() - wall_start
    result.driver_cpu = os.times().user + os.times().system - driver_start
    result.machine_cpu = machine_busy_seconds() - machine_start
    result.cpu = [r.cpu() for r in replicas]
    result.rss_peak = [r.rss_peak for r in replicas]
    result.rss_by_minute = [minute_rss(samples) for samples in steady_samples]
    result.requests, result.failures = counters.requests, counters.failures
    result.server_errors = [server_errors(r.log) for r in replicas]
    try:
        await storm_outcome(replicas[0], read_token, fault.job, fault.name, result)
    except httpx.HTTPError as exc:  # a replica still buried in its backlog
        result.storm_diagnoses = [f"no answer: {exc!r}"]
    await count_check(replicas, nodes, read_token, result)
    result.database_growth = database_bytes(replicas[0].database) - database_start
    return result


def database_bytes(database: str) -> int:
    """The database's size now: the embedded file and its WAL, or `pg_database_size`."""
    if not database.startswith("postgresql"):
        return sum(p.stat().st_size for p in Path(database).glob("diagnoser.db*"))
    from sqlalchemy import text

    from diagnoser.store.database import create_sync_engine, parse_database_url

    engine = create_sync_engine(parse_database_url(database))
    try:
        with engine.connect() as conn:
            return int(conn.scalar(text("SELECT pg_database_size(current_database())")) or 0)
    finally:
        engine.dispose()


def server_errors(log: Path) -> str:
    """How many tracebacks a replica logged, and the last exception line (a 500's cause)."""
    lines = log.read_text(errors="replace").splitlines()
    count = sum(1 for line in lines if line.startswith("Traceback"))
    last = next(
        (line for line in reversed(lines) if line and not line.startswith((" ", "\t"))
         and ("Error" in line or "Exception" in line)),
        "",
    )  # fmt: skip
    return f"{count} tracebacks" + (f", last: {last[:200]}" if count else "")


def minute_rss(samples: list[tuple[float, int]]) -> list[int]:
    """The highest RSS of each minute of the run (bounded means: it stops growing)."""
    if not samples:
        return []
    start = samples[0][0]
    minutes: dict[int, int] = {}
    for at, rss in samples:
        minute = int((at - start) // 60)
        minutes[minute] = max(minutes.get(minute, 0), rss)
    return [minutes[m] for m in sorted(minutes)]


async def storm_outcome(replica: Replica, token: str, job: str, node: str, result: Result) -> None:
    """Every cordon of the storm job, the job's diagnoses, and diagnoses on other jobs."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=replica.base_url, headers=headers, timeout=OUTCOME_TIMEOUT_S
    ) as http:
        actions = (await http.get("/v1/actions", params={"job_id": job, "limit": 500})).json()
        result.cordons = [
            str(a["target"].get("node")) for a in actions["items"] if a["kind"] == "cordon_node"
        ]
        found = (await http.get(f"/v1/jobs/{job}/diagnoses")).json()["diagnoses"]
        result.storm_diagnoses = [
            f"{d['action']} {','.join(d['culprit_nodes']) or '-'}" for d in found
        ]
        every = (await http.get("/v1/diagnoses", params={"limit": 200})).json()["diagnoses"]
        others = [d for d in every if d["job_id"] != job]
        result.healthy_diagnoses = len(others)
        result.healthy_examples = [
            f"{d['job_id']}: {d['action']} {d['failure_type']} {d['summary'][:120]}"
            for d in others[:3]
        ]


_console = Console(highlight=False, width=200, soft_wrap=True)


def console_line(text: str) -> None:
    _console.print(text, markup=False)


# --- the report ---------------------------------------------------------------------------


def ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:,.1f}"


def sec(seconds: float | None) -> str:
    return "not seen" if seconds is None else f"{seconds:.2f}"


def mib(values: Sequence[int]) -> str:
    return " / ".join(f"{v / 2**20:,.0f}" for v in values)


def ratio(value: float, peer: float) -> str:
    if not peer or math.isnan(value) or math.isnan(peer):
        return "-"
    return f"{value / peer:.2f}x"


def show(title: str, columns: Sequence[str], rows: list[list[str]]) -> None:
    """A rich table, then the same rows as Markdown for BENCHMARKS.md."""
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < 1 else "right")
    for row in rows:
        table.add_row(*row)
    _console.print(table)
    _console.print(f"\n**{title}**\n", markup=False)
    _console.print("| " + " | ".join(columns) + " |", markup=False)
    _console.print("|---|" + "|".join("---:" for _ in columns[1:]) + "|", markup=False)
    for row in rows:
        _console.print("| " + " | ".join(row) + " |", markup=False)
    _console.print()


def verdict(result: Result) -> list[str]:
    """The targets, met or not, in words."""
    cordon_ok = result.cordons == [result.fault_node]
    in_time = result.fault_to_action is not None and result.fault_to_action <= TARGET_DIAGNOSIS_S
    storm_ok = in_time and cordon_ok
    return [
        f"{'met' if result.achieved >= 0.95 * result.offered else 'MISSED'}: "
        f"{result.achieved:,.0f} of {result.offered:,.0f} lines/s offered",
        f"{'met' if result.p99 < TARGET_P99_S else 'MISSED'}: p99 {ms(result.p99)} ms "
        f"(target < {TARGET_P99_S * 1000:.0f})",
        f"{'met' if storm_ok else 'MISSED'}"
        f": fault to diagnosis {sec(result.fault_to_diagnosis)} s, to cordon claimed "
        f"{sec(result.fault_to_action)} s, cordons {result.cordons or 'none'}",
        f"{'met' if not result.mismatched else 'MISSED'}: count check, "
        f"{result.streams - len(result.mismatched)} of {result.streams} streams exact"
        + (
            f" ({result.undrained} not drained at the end: {result.unsent_lines:,} lines "
            "not acknowledged to the driver, checked up to their committed offset)"
            if result.undrained
            else ""
        ),
    ]


def report(args: argparse.Namespace, results: list[Result]) -> None:
    peer = results[0]
    columns = [
        "mode",
        "nodes",
        "offered lines/s",
        "achieved lines/s",
        f"vs {peer.mode}",
        "upload p50 ms",
        "upload p99 ms",
        f"p99 vs {peer.mode}",
        "errors",
        "fault->diagnosis s",
        "fault->cordon s",
        "cordons",
        "count check",
    ]
    rows = []
    for r in results:
        errors = sum(r.failures.values())
        rows.append(
            [
                r.mode,
                f"{r.nodes:,}",
                f"{r.offered:,.0f}",
                f"{r.achieved:,.0f}",
                ratio(r.achieved, peer.achieved),
                ms(r.p50),
                ms(r.p99),
                ratio(r.p99, peer.p99),
                f"{errors:,}",
                sec(r.fault_to_diagnosis),
                sec(r.fault_to_action),
                ",".join(r.cordons) or "none",
                f"{r.streams - len(r.mismatched)}/{r.streams} exact",
            ]
        )
    show("Load: M nodes, one connection each, then a storm", columns, rows)
    columns = [
        "mode",
        "replica CPU s",
        "CPU s per 1M lines",
        "peak RSS MiB",
        "RSS per minute MiB (max)",
        "driver CPU s",
        "machine busy s",
        "wall s",
        "lines sent",
        "lines committed",
        "database MB per 1M lines",
    ]
    rows = []
    for r in results:
        per_million = sum(r.cpu) / max(r.committed_lines, 1) * 1e6
        rows.append(
            [
                r.mode,
                " / ".join(f"{c:.1f}" for c in r.cpu),
                f"{per_million:.1f}",
                mib(r.rss_peak),
                " / ".join(",".join(f"{v / 2**20:.0f}" for v in m) for m in r.rss_by_minute),
                f"{r.driver_cpu:.1f}",
                f"{r.machine_cpu:.1f}",
                f"{r.wall:.0f}",
                f"{r.sent_lines:,}",
                f"{r.committed_lines:,}",
                f"{r.database_growth / 1e6 / max(r.committed_lines, 1) * 1e6:.1f}",
            ]
        )
    show("Load: resources per replica", columns, rows)
    for r in results:
        if r.steps:
            best = [s for s in r.steps if s.achieved >= 0.95 * s.offered and not s.errors]
            show(
                f"Ramp, {r.mode}: peak sustained "
                f"{max((s.achieved for s in best), default=0):,.0f} lines/s",
                [
                    "offered lines/s",
                    "achieved lines/s",
                    "achieved / offered",
                    "p50 ms",
                    "p99 ms",
                    "errors",
                ],
                [
                    [
                        f"{s.offered:,.0f}",
                        f"{s.achieved:,.0f}",
                        ratio(s.achieved, s.offered),
                        ms(s.p50),
                        ms(s.p99),
                        f"{s.errors:,}",
                    ]
                    for s in r.steps
                ],
            )
    for r in results:
        console_line(f"{r.mode}:")
        for line in verdict(r):
            console_line(f"  {line}")
        if r.failures:
            console_line(f"  errors: {dict(r.failures)}")
        console_line(
            f"  storm job diagnoses: {r.storm_diagnoses}; on healthy jobs: {r.healthy_diagnoses}"
            + (f" {r.healthy_examples}" if r.healthy_examples else "")
        )
        for index, logged in enumerate(r.server_errors):
            console_line(f"  replica {index} log: {logged}")
        for problem in r.mismatched[:10]:
            console_line(f"  count: {problem}")
    console_line(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}; raised for the run: "
        + ", ".join(f"{k}={v}" for k, v in RAISED.items())
        + f"; RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    )


# --- entry --------------------------------------------------------------------------------


def rates(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES)
    )
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes (M)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--job-nodes", type=int, default=64, help="nodes per job")
    parser.add_argument("--rate", type=float, default=10.0, help="lines/s per node")
    parser.add_argument("--interval", type=float, default=1.0, help="s between a node's sends")
    parser.add_argument(
        "--wire",
        choices=("chunked", "requests"),
        default="chunked",
        help="chunked: long uploads as `diagnoser ship` (default); requests: a POST per interval",
    )
    parser.add_argument(
        "--request-s", type=float, default=10.0, help="chunked: seconds one upload stays open"
    )
    parser.add_argument(
        "--request-spread",
        type=float,
        default=0.1,
        help="chunked: later uploads last a random time in this last share of --request-s",
    )
    parser.add_argument(
        "--in-step",
        action="store_true",
        help="chunked: every upload lasts --request-s (shippers before the random phase)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="steady measurement")
    parser.add_argument("--soak-minutes", type=float, default=0.0, help="steady phase in minutes")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument(
        "--ramp", type=rates, default=[], help="total lines/s steps, e.g. 5000,10000"
    )
    parser.add_argument("--step-seconds", type=float, default=15.0)
    parser.add_argument("--fault-node", type=int, default=3, help="index in job 0")
    parser.add_argument("--storm-delay-s", type=float, default=0.5)
    parser.add_argument("--storm-timeout-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--drain-timeout-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile replica 0 here")
    parser.add_argument("--logs", type=Path, default=None, help="copy the serve logs here")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    if args.nodes < 1 or args.job_nodes < 1 or args.ranks < 1:
        parser.error("--nodes, --job-nodes and --ranks must be at least 1")
    return args


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    raise_fd_limit()
    results: list[Result] = []
    for mode in args.modes:
        console_line(f"{mode}: starting")
        with services(mode, args.profile, args.logs) as (replicas, admin):
            results.append(asyncio.run(run_mode(args, mode, replicas, admin)))
        console_line(f"{mode}: done, {results[-1].achieved:,.0f} lines/s")
    report(args, results)
    if args.json is not None:
        args.json.write_text(json.dumps([result_json(r) for r in results], indent=2))
    return results


def result_json(result: Result) -> JsonObject:
    return {
        "mode": result.mode,
        "nodes": result.nodes,
        "offered_lines_per_s": result.offered,
        "achieved_lines_per_s": result.achieved,
        "p50_s": result.p50,
        "p99_s": result.p99,
        "errors": dict(result.failures),
        "fault_to_diagnosis_s": result.fault_to_diagnosis,
        "fault_to_action_s": result.fault_to_action,
        "cordons": result.cordons,
        "healthy_diagnoses": result.healthy_diagnoses,
        "cpu_s": result.cpu,
        "rss_peak_bytes": result.rss_peak,
        "streams": result.streams,
        "mismatched": result.mismatched,
        "undrained_streams": result.undrained,
        "unsent_lines": result.unsent_lines,
        "sent_lines": result.sent_lines,
        "committed_lines": result.committed_lines,
        "database_growth_bytes": result.database_growth,
        "rss_by_minute_bytes": result.rss_by_minute,
    }


if __name__ == "__main__":
    main()
