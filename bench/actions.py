"""Recovery actions: claims per second, and time from the decisive log line to claim and cordon.

    python bench/actions.py                                   # both parts, about 3-5 minutes
    python bench/actions.py --parts claims --actions 2000 --batch 1,10
    python bench/actions.py --parts latency --samples 50 --nodes 1000

Needs the actions API (`POST /v1/actions/claim`, issue 14); the cordon latency also needs
`diagnoser operator`. Without them the script says so and exits with status 2.

1. Claims per second. A real `diagnoser serve` with `DIAGNOSER_ACTIONS__DRY_RUN=false` on a
   throwaway PostgreSQL cluster (started as the suite starts it, migrated), and on the embedded
   SQLite as the peer. `--actions` jobs each post one NCCL watchdog timeout line: a diagnosis
   without a culprit recommends `restart_job`, so each job gets one claimable `restart_job`
   action and the blast radius (which caps cordons) does not apply. Then O operators (asyncio
   tasks, one keep-alive connection each) loop `POST /v1/actions/claim {max: B, lease_seconds:
   300}` and complete every claimed action `done`, until the outbox is empty. Reported:
   actions claimed and completed per second over the wall time (an operator's real cycle),
   claim round trip p50/p99, and how many actions two operators both got (must be 0:
   `SELECT ... FOR UPDATE SKIP LOCKED`). Rows: 1 and 4 operators on each backend, per batch
   size; the ratio is to 1 operator on PostgreSQL.
2. Latency. A fresh `diagnoser serve` (SQLite) per scenario; `--nodes` nodes are made known
   first (one benign line each), so the blast-radius cap (10 % of known nodes per hour by
   default) leaves room for `--samples` cordons plus one warm-up (keep `--nodes` at least 10x
   that, or the last samples are rightly suppressed, and counted as such). A sample is a fresh
   job on a fresh node: one POST of ~8 KiB of benign lines ending in `NVRM: Xid ... 79, GPU has
   fallen off the bus`.
   Timed from the moment the POST is sent:
   * `diagnosis stored`: the POST returns (its answer names the diagnosis; the peer);
   * `cordon claimable`: a claimer long-polling `POST /v1/actions/claim {kinds: [cordon_node],
     wait_seconds: 30}` receives the node's action (it then completes it `done`);
   * `Node cordoned`: with `diagnoser operator --kubeconfig` against a kmock emulator holding
     the Nodes (in this process), the Node's `spec.unschedulable` turns true; polled every 5 ms.
   A sample the policy suppressed (no claim within `--timeout-s`) is counted, not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy
from processes import percentile, serve, throwaway_postgres
from rich.console import Console
from rich.table import Table
from training_log import benign_text

from diagnoser.store.database import parse_database_url
from diagnoser.store.migrate import upgrade

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
"""The suite's PostgreSQL server and the demo's emulator helpers live outside bench/."""

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
NCCL_TIMEOUT = (
    "[rank0]:[E1201 11:40:12.183009389 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=97, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.\n"
)
NOT_BUILT = (
    "bench/actions.py needs the actions API (POST /v1/actions/claim, issue 14), which this "
    "build of diagnoser does not have; run it once that lands"
)
NO_OPERATOR = "no `diagnoser operator` in this build (issue 14): the cordon column is skipped"
JsonObject = dict[str, Any]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def show(console: Console, title: str, columns: Sequence[str], rows: list[list[str]]) -> None:
    """A rich table, then the same rows as Markdown for BENCHMARKS.md."""
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index < 2 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"\n**{title}**\n", markup=False)
    console.print("| " + " | ".join(columns) + " |", markup=False)
    console.print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|")
    for row in rows:
        console.print("| " + " | ".join(row) + " |", markup=False)
    console.print()


# --- servers ------------------------------------------------------------------------------


def fresh_pg_database(server_url: str) -> str:
    import psycopg

    url = sqlalchemy.engine.make_url(server_url)
    name = f"bench_{os.urandom(6).hex()}"
    with psycopg.connect(
        f"host={url.host} port={url.port} user={url.username} dbname=postgres", autocommit=True
    ) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    database = str(url.set(database=name).render_as_string(hide_password=False))
    upgrade(parse_database_url(database))
    return database


@contextlib.contextmanager
def service(database_url: str | None) -> Iterator[str]:
    """`diagnoser serve` with actions released (dry-run off), on SQLite or the given database."""
    settings = {"DIAGNOSER_RULES_WATCH": "false", "DIAGNOSER_ACTIONS__DRY_RUN": "false"}
    with (
        tempfile.TemporaryDirectory(prefix="bench-actions-") as data,
        serve(Path(data), settings, database_url, timeout_s=60) as url,
    ):
        yield url


async def require_actions_api(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/actions/claim", json={"operator_id": "probe", "max": 1})
    if response.status_code in {404, 405}:
        sys.exit(f"error: {NOT_BUILT}")
    response.raise_for_status()


async def post_log(http: httpx.AsyncClient, job: str, node: str, text: str) -> JsonObject:
    response = await http.post(
        f"/v1/jobs/{job}/logs",
        params={"node": node},
        content=text.encode(),
        headers={"Content-Type": "text/plain"},
    )
    response.raise_for_status()
    body: JsonObject = response.json()
    return body


async def claim(
    http: httpx.AsyncClient,
    operator: str,
    batch: int,
    *,
    kinds: list[str] | None = None,
    wait_seconds: int = 0,
) -> list[JsonObject]:
    body: JsonObject = {
        "operator_id": operator,
        "max": batch,
        "lease_seconds": 300,
        "wait_seconds": wait_seconds,
    }
    if kinds is not None:
        body["kinds"] = kinds
    response = await http.post("/v1/actions/claim", json=body, timeout=wait_seconds + 30)
    response.raise_for_status()
    actions: list[JsonObject] = response.json()["actions"]
    return actions


async def complete(http: httpx.AsyncClient, operator: str, action_id: int) -> None:
    response = await http.post(
        f"/v1/actions/{action_id}/complete",
        json={"operator_id": operator, "status": "done", "message": "bench"},
    )
    response.raise_for_status()


# --- 1. claims per second -------------------------------------------------------------------


@dataclass
class ClaimRun:
    backend: str
    operators: int
    batch: int
    actions: int = 0
    seconds: float = 0.0
    claim_times: list[float] = field(default_factory=list)
    duplicates: int = 0


async def seed_restarts(base_url: str, count: int, concurrency: int = 8) -> None:
    """One claimable `restart_job` per job: a lone NCCL timeout names no culprit."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            while not queue.empty():
                index = queue.get_nowait()
                await post_log(http, f"claims-{index}", f"cnode-{index % 64}", NCCL_TIMEOUT)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def drain(base_url: str, run: ClaimRun) -> None:
    claimed: Counter[int] = Counter()

    async def operator(name: str) -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            while True:
                started = time.perf_counter()
                actions = await claim(http, name, run.batch)
                run.claim_times.append(time.perf_counter() - started)
                if not actions:
                    return
                for action in actions:
                    claimed[int(action["id"])] += 1
                    await complete(http, name, int(action["id"]))

    started = time.perf_counter()
    await asyncio.gather(*(operator(f"op-{i}") for i in range(run.operators)))
    run.seconds = time.perf_counter() - started
    run.actions = len(claimed)
    run.duplicates = sum(1 for count in claimed.values() if count > 1)


async def claims_run(
    backend: str, database_url: str | None, operators: int, batch: int, count: int
) -> ClaimRun:
    run = ClaimRun(backend, operators, batch)
    with service(database_url) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            await require_actions_api(http)
        await seed_restarts(base_url, count)
        await drain(base_url, run)
    return run


def claims_section(args: argparse.Namespace, console: Console) -> None:
    runs: list[ClaimRun] = []
    plans = [(ops, batch) for batch in args.batch for ops in (1, 4)]
    with throwaway_postgres() as server_url:
        if server_url is None:
            console.print("claims: no PostgreSQL server binaries here: SQLite rows only")
        for operators, batch in plans:
            if server_url is not None:
                console.print(f"claims: PostgreSQL, {operators} operator(s), batch {batch} ...")
                url = fresh_pg_database(server_url)
                measured = claims_run("PostgreSQL", url, operators, batch, args.actions)
                runs.append(asyncio.run(measured))
            console.print(f"claims: SQLite, {operators} operator(s), batch {batch} ...")
            runs.append(asyncio.run(claims_run("SQLite", None, operators, batch, args.actions)))
    peers = {
        run.batch: run.actions / run.seconds
        for run in runs
        if run.backend == "PostgreSQL" and run.operators == 1 and run.seconds
    }
    rows = []
    for run in runs:
        rate = run.actions / run.seconds if run.seconds else 0.0
        peer = peers.get(run.batch)
        rows.append(
            [
                run.backend,
                str(run.operators),
                str(run.batch),
                str(run.actions),
                f"{rate:,.0f}",
                ms(statistics.median(run.claim_times)) if run.claim_times else "-",
                ms(percentile(run.claim_times, 0.99)),
                str(run.duplicates),
                f"{rate / peer:.2f}x" if peer else "-",
            ]
        )
    columns = (
        "backend", "operators", "batch", "claimed", "claimed and done per s", "claim p50 ms",
        "claim p99 ms", "claimed twice", "vs 1 op on PostgreSQL",
    )  # fmt: skip
    show(console, f"Claims ({args.actions} claimable restart_job actions)", columns, rows)


# --- 2. latency ---------------------------------------------------------------------------


@dataclass
class LatencyRun:
    name: str
    stored: list[float] = field(default_factory=list)
    claimable: list[float] = field(default_factory=list)
    cordoned: list[float] = field(default_factory=list)
    suppressed: int = 0


async def make_nodes_known(base_url: str, nodes: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for index in range(nodes):
            await post_log(http, "warm-up", f"node-{index}", "NCCL INFO Bootstrap : Using eth0\n")


async def claimed_within(
    http: httpx.AsyncClient, node: str, timeout_s: float
) -> tuple[float, JsonObject] | None:
    deadline = time.perf_counter() + timeout_s
    while (left := deadline - time.perf_counter()) > 0:
        wait = max(0, min(30, int(left)))
        for action in await claim(http, "bench", 10, kinds=["cordon_node"], wait_seconds=wait):
            await complete(http, "bench", int(action["id"]))
            if action["target"].get("node") == node:
                return time.perf_counter(), action
    return None


async def latency_claims(args: argparse.Namespace, run: LatencyRun, prefix: str) -> None:
    """Sample 0 is a warm-up (first connections, first queries) and is not kept."""
    with service(None) as base_url:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as poster,
            httpx.AsyncClient(base_url=base_url, timeout=60) as claimer,
        ):
            await require_actions_api(poster)
            await make_nodes_known(base_url, args.nodes)
            for sample in range(min(args.samples + 1, args.nodes)):
                node = f"node-{sample}"
                claimed = asyncio.create_task(claimed_within(claimer, node, args.timeout_s))
                await asyncio.sleep(0)
                sent = time.perf_counter()
                await post_log(poster, f"lat-{sample}", node, prefix + XID79)
                stored = time.perf_counter() - sent
                result = await claimed
                if sample == 0:
                    continue
                run.stored.append(stored)
                if result is None:
                    run.suppressed += 1
                else:
                    run.claimable.append(result[0] - sent)


async def cordoned_within(cluster: Any, node: str, timeout_s: float) -> float | None:
    """When the emulator's Node turned unschedulable (polled every 5 ms), or None."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if cluster.objects["v1/nodes", None, node].get("spec", {}).get("unschedulable"):
            return time.perf_counter()
        await asyncio.sleep(0.005)
    return None


@contextlib.asynccontextmanager
async def emulator(nodes: Sequence[str]) -> AsyncIterator[tuple[Any, str]]:
    """The demo's kmock emulator holding the Nodes, and its kubeconfig text."""
    import kmock
    import yaml

    from examples.cluster_demo.cluster import kubeconfig, node_object

    async with kmock.KubernetesEmulator() as cluster, kmock.Server(cluster) as server:
        for name in nodes:
            cluster.objects["v1/nodes", None, name] = node_object(name)
        yield cluster, yaml.safe_dump(kubeconfig(str(server.url).rstrip("/")))


async def latency_cordons(args: argparse.Namespace, run: LatencyRun, prefix: str) -> None:
    names = [f"node-{index}" for index in range(args.nodes)]
    with tempfile.TemporaryDirectory(prefix="bench-kube-") as scratch, service(None) as base_url:
        config = Path(scratch) / "kubeconfig.yaml"
        async with emulator(names) as (cluster, kubeconfig_text):
            await asyncio.to_thread(config.write_text, kubeconfig_text)
            operator = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "diagnoser", "operator", "--server", base_url,
                "--kubeconfig", str(config),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                async with httpx.AsyncClient(base_url=base_url, timeout=30) as poster:
                    await require_actions_api(poster)
                    await make_nodes_known(base_url, args.nodes)
                    # Sample 0 also waits for the operator to start; it is not kept.
                    for sample in range(min(args.samples + 1, args.nodes)):
                        node = names[sample]
                        sent = time.perf_counter()
                        await post_log(poster, f"cordon-{sample}", node, prefix + XID79)
                        stored = time.perf_counter() - sent
                        timeout = args.timeout_s + (60 if sample == 0 else 0)
                        cordoned = await cordoned_within(cluster, node, timeout)
                        if sample == 0:
                            continue
                        run.stored.append(stored)
                        if cordoned is None:
                            run.suppressed += 1
                        else:
                            run.cordoned.append(cordoned - sent)
            finally:
                operator.terminate()
                await operator.wait()


def latency_section(args: argparse.Namespace, console: Console) -> None:
    prefix, _ = benign_text(random.Random(7), 8 * 1024)
    claims = LatencyRun("claimer on the API (SQLite)")
    console.print(f"latency: {args.samples} samples, the bench's own claimer ...")
    asyncio.run(latency_claims(args, claims, prefix))
    runs = [claims]
    if importlib.util.find_spec("diagnoser.operator") is None:
        console.print(NO_OPERATOR)
    else:
        cordons = LatencyRun("diagnoser operator + kmock (SQLite)")
        console.print(f"latency: {args.samples} samples, diagnoser operator on kmock ...")
        asyncio.run(latency_cordons(args, cordons, prefix))
        runs.append(cordons)
    rows = []
    for run in runs:
        peer = statistics.median(run.stored) if run.stored else float("nan")
        for milestone, values in (
            ("diagnosis stored (POST returned)", run.stored),
            ("cordon_node claimable", run.claimable),
            ("Node cordoned in the emulator", run.cordoned),
        ):
            if values:
                rows.append(
                    [
                        run.name,
                        milestone,
                        str(len(values)),
                        ms(statistics.median(values)),
                        ms(percentile(values, 0.99)),
                        ms(max(values)),
                        f"{statistics.median(values) / peer:.1f}x",
                        str(run.suppressed),
                    ]
                )
    columns = (
        "scenario", "from the decisive line to", "samples", "p50 ms", "p99 ms", "max ms",
        "p50 vs diagnosis stored", "suppressed",
    )  # fmt: skip
    show(console, "Decisive log line to action", columns, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--parts", default="claims,latency")
    parser.add_argument("--actions", type=int, default=1000)
    parser.add_argument("--batch", type=lambda text: [int(b) for b in text.split(",")],
                        default=[1, 10])  # fmt: skip
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--timeout-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    if importlib.util.find_spec("diagnoser.api.actions") is None:
        console.print(f"error: {NOT_BUILT}", markup=False)
        return 2
    if args.nodes < 10 * (args.samples + 1):
        console.print(
            f"note: {args.nodes} known nodes allow about {max(1, args.nodes // 10)} cordons per "
            f"hour under the default blast radius; {args.samples + 1} samples will see some "
            "suppressed",
            markup=False,
        )
    parts = set(args.parts.split(","))
    if "claims" in parts:
        claims_section(args, console)
    if "latency" in parts:
        latency_section(args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
