"""The cluster demo end to end: `run_demo(config) -> Timeline`.

1. A kmock Kubernetes emulator on loopback with the Nodes, a PyTorchJob and its worker pods.
2. `diagnoser serve` on a free loopback port: the embedded SQLite default in a scratch
   directory, with `DIAGNOSER_ACTIONS__DRY_RUN=false` when the service has the actions API.
3. One simulated rank per node, each under `diagnoser run` (rank.py): progress, then the faulty
   node's GPU falls off the bus and the other ranks time out in NCCL.
4. The service's diagnosis is followed through `GET /v1/jobs/{job}/diagnoses`.
5. With the operator: `diagnoser operator --server ... --kubeconfig ...` against the emulator,
   until the faulty Node is cordoned and the job's pods are recreated; actions are followed
   through `GET /v1/actions?job_id=...`.

Every change seen is a timeline step; the final diagnosis, actions, Nodes and pods are read back
at the end. Nothing here decides anything: the service diagnoses, the operator acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from examples.cluster_demo.cluster import (
    NAMESPACE,
    EmulatedCluster,
    Recreation,
    emulated_cluster,
    is_cordoned,
    worker_name,
)
from examples.cluster_demo.processes import (
    Child,
    LineSink,
    clean_environment,
    diagnoser_command,
    free_port,
    wait_healthy,
)
from examples.cluster_demo.timeline import Timeline, is_cordoned_by_diagnoser

RANK_PROGRAM = Path(__file__).with_name("rank.py")
START_FILE = "rendezvous"
POLL_SECONDS = 0.1
TERMINAL_STATES = frozenset({"done", "failed", "suppressed", "expired", "cancelled"})
ITERATION = re.compile(r"iteration\s+(\d+)/.*?tokens/s: (\d+).*?lm loss: (\S+)")
CHECKPOINT = re.compile(r"successfully saved checkpoint at iteration\s+(\d+)")
WATCHDOG = re.compile(r"SeqNum=(\d+), OpType=(\w+).*?ran for (\d+) milliseconds")
UPTIME = re.compile(r"^\[\s*\d+\.\d+\]\s*")

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class DemoConfig:
    job_id: str = "train-demo"
    workers: int = 4
    faulty_rank: int = 2
    fail_at: int = 12
    """Iteration at which the faulty rank's GPU falls off the bus."""
    step_seconds: float = 0.2
    nccl_timeout_ms: int = 2000
    spare_nodes: int = 0
    """Extra idle Nodes the restarted worker can move to (0: it stays Pending)."""
    operator: bool = True
    deadline_s: float = 240.0
    """How long the whole demo may take before it gives up (a loaded machine is slow)."""
    work_dir: Path | None = None

    @property
    def faulty_node(self) -> str:
        return f"node-{self.faulty_rank}"


class DemoTimeoutError(Exception):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    async def until(self, check: Callable[[], bool], what: str) -> None:
        while not check():
            if time.monotonic() > self.at:
                raise DemoTimeoutError(f"gave up waiting for {what}")
            await asyncio.sleep(POLL_SECONDS)


class Observer:
    """Turns rank output, API state and emulator state into timeline steps."""

    def __init__(self, timeline: Timeline, config: DemoConfig, echo: LineSink | None) -> None:
        self.timeline = timeline
        self.config = config
        self.echo = echo
        self.seen_iteration = False
        self.ranks_up: set[str] = set()
        self.nodes_seeded = False
        self.seen: dict[str, tuple[object, ...]] = {}

    def line(self, who: str, text: str) -> None:
        if self.echo is not None:
            self.echo(who, text)
        if who == "operator":
            return
        if "NCCL INFO comm" in text and "Init COMPLETE" in text:
            self.ranks_up.add(who)
        if (match := ITERATION.search(text)) and not self.seen_iteration:
            self.seen_iteration = True
            iteration, tokens, loss = match.groups()
            self.timeline.add(
                who, f"iteration {iteration}: lm loss {loss}, {int(tokens):,} tokens/s"
            )
        elif match := CHECKPOINT.search(text):
            self.timeline.add(who, f"checkpoint saved at iteration {match.group(1)}")
        elif "NVRM: Xid" in text or ("NVRM: GPU" in text and "fallen off the bus" in text):
            self.timeline.add(who, f"kernel: {UPTIME.sub('', text)}")
        elif "CUDA error:" in text:
            self.timeline.add(who, text.strip())
        elif "terminated" not in text and (match := WATCHDOG.search(text)):
            seq, op, ran_ms = match.groups()
            self.timeline.add(who, f"NCCL watchdog: {op} SeqNum={seq} timed out after {ran_ms} ms")

    def changed(self, key: str, state: tuple[object, ...]) -> bool:
        if self.seen.get(key) == state:
            return False
        self.seen[key] = state
        return True

    def diagnoses(self, diagnoses: list[JsonObject]) -> None:
        self.timeline.diagnoses = diagnoses
        for diagnosis in diagnoses:
            state = (
                diagnosis.get("failure_type"),
                diagnosis.get("action"),
                tuple(diagnosis.get("culprit_nodes") or ()),
                diagnosis.get("status"),
            )
            key = f"diagnosis:{diagnosis['id']}"
            verb = "updated" if key in self.seen else "opened"
            if self.changed(key, state):
                culprits = ", ".join(diagnosis.get("culprit_nodes") or []) or "no culprit"
                self.timeline.add(
                    "service",
                    f"diagnosis {str(diagnosis['id'])[:8]} {verb}: {diagnosis.get('category')}/"
                    f"{diagnosis.get('failure_type')} on {culprits} -> {diagnosis.get('action')}"
                    f" ({diagnosis.get('status')})",
                )

    def actions(self, actions: list[JsonObject]) -> None:
        self.timeline.actions = actions
        for action in actions:
            state = (action.get("state"), action.get("lease_owner"))
            if self.changed(f"action:{action['id']}", state):
                owner = f" by {action['lease_owner']}" if action.get("lease_owner") else ""
                target = action.get("target") or {}
                subject = target.get("node") or target.get("name") or self.config.job_id
                self.timeline.add(
                    "service",
                    f"action {action['id']} {action.get('kind')} {subject}: "
                    f"{action.get('state')}{owner}",
                )

    def nodes(self, nodes: list[JsonObject]) -> None:
        self.timeline.nodes = nodes
        for node in nodes:
            name = str(node["metadata"]["name"])
            taints = tuple(
                f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
                for t in node.get("spec", {}).get("taints") or []
            )
            if self.changed(f"node:{name}", (is_cordoned(node), taints)) and self.nodes_seeded:
                cordon = "cordoned" if is_cordoned(node) else "schedulable"
                self.timeline.add(
                    "emulator", f"Node {name} {cordon}; taints: {', '.join(taints) or 'none'}"
                )
        self.nodes_seeded = True

    def recreated(self, recreation: Recreation) -> None:
        where = recreation.node or "no node"
        self.timeline.add(
            "controller",
            f"pod {recreation.pod} was deleted; created again on {where} ({recreation.phase})",
        )


class ServiceApi:
    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=10)

    async def close(self) -> None:
        await self.http.aclose()

    async def put_job(self, job_id: str, metadata: JsonObject) -> None:
        response = await self.http.put(f"/v1/jobs/{job_id}", json=metadata)
        response.raise_for_status()

    async def diagnoses(self, job_id: str) -> list[JsonObject]:
        response = await self.http.get(f"/v1/jobs/{job_id}/diagnoses")
        response.raise_for_status()
        diagnoses: list[JsonObject] = response.json()["diagnoses"]
        return diagnoses

    async def actions(self, job_id: str) -> list[JsonObject]:
        """Every action of the job, across pages, oldest first."""
        items: list[JsonObject] = []
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"job_id": job_id, "limit": 100}
            if cursor:
                params["cursor"] = cursor
            response = await self.http.get("/v1/actions", params=params)
            response.raise_for_status()
            page = response.json()
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return sorted(items, key=lambda action: int(action["id"]))


async def _watch(
    observer: Observer, service: ServiceApi, cluster: EmulatedCluster, config: DemoConfig
) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            observer.diagnoses(await service.diagnoses(config.job_id))
            observer.actions(await service.actions(config.job_id))
        with contextlib.suppress(httpx.HTTPError):
            observer.nodes(await cluster.api.nodes())
        await asyncio.sleep(POLL_SECONDS)


def _diagnosed(timeline: Timeline, config: DemoConfig) -> bool:
    diagnosis = timeline.diagnosis
    return (
        diagnosis is not None
        and diagnosis.get("action") == "cordon_node_and_restart"
        and config.faulty_node in (diagnosis.get("culprit_nodes") or [])
    )


def _restarted(timeline: Timeline, cluster: EmulatedCluster, config: DemoConfig) -> bool:
    recreated = {r.pod for r in cluster.recreations}
    return all(worker_name(config.job_id, rank) in recreated for rank in range(config.workers))


def _acted(timeline: Timeline, cluster: EmulatedCluster, config: DemoConfig) -> bool:
    node = timeline.node(config.faulty_node)
    cordoned = node is not None and is_cordoned_by_diagnoser(node)
    settled = bool(timeline.actions) and all(
        action.get("state") in TERMINAL_STATES for action in timeline.actions
    )
    return cordoned and _restarted(timeline, cluster, config) and settled


def _rank_command(config: DemoConfig, server: str, work_dir: Path, rank: int) -> list[str]:
    node = f"node-{rank}"
    wrapper = diagnoser_command(
        "run", "--server", server, "--job", config.job_id, "--node", node, "--rank", str(rank),
        "--log", str(work_dir / f"{node}.log"), "--heartbeat-seconds", "1",
        "--drain-seconds", "15", "--",
    )  # fmt: skip
    program = [
        sys.executable, str(RANK_PROGRAM), "--rank", str(rank), "--world", str(config.workers),
        "--node", node, "--start-file", str(work_dir / START_FILE),
        "--step-seconds", str(config.step_seconds), "--fail-at", str(config.fail_at),
        "--faulty-rank", str(config.faulty_rank), "--nccl-timeout-ms", str(config.nccl_timeout_ms),
    ]  # fmt: skip
    return [*wrapper, *program]


async def run_demo(config: DemoConfig, echo: LineSink | None = None) -> Timeline:
    """Run the demo; `echo` receives every line the ranks and the operator print."""
    timeline = Timeline()
    observer = Observer(timeline, config, echo)
    with contextlib.ExitStack() as stack:
        if config.work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="demo-")))
        else:
            work_dir = config.work_dir
            work_dir.mkdir(parents=True, exist_ok=True)
        async with emulated_cluster(
            config.job_id, config.workers, work_dir, spare_nodes=config.spare_nodes,
            on_recreate=observer.recreated,
        ) as cluster:  # fmt: skip
            await Run(config, timeline, observer, cluster, work_dir).run()
    return timeline


class Run:
    """One run of the demo: its child processes, in the order the story needs them."""

    def __init__(
        self,
        config: DemoConfig,
        timeline: Timeline,
        observer: Observer,
        cluster: EmulatedCluster,
        work_dir: Path,
    ) -> None:
        self.config = config
        self.timeline = timeline
        self.observer = observer
        self.cluster = cluster
        self.work_dir = work_dir
        self.deadline = Deadline(config.deadline_s)
        self.base_url = f"http://127.0.0.1:{free_port()}"
        self.api = ServiceApi(self.base_url)
        self.children: list[Child] = []

    async def run(self) -> None:
        config, timeline = self.config, self.timeline
        timeline.add(
            "emulator",
            f"Kubernetes API (kmock) at {self.cluster.url}: {len(self.cluster.nodes)} Nodes, "
            f"PyTorchJob {NAMESPACE}/{config.job_id} with {config.workers} worker pods Running, "
            "1 other pod",
        )
        watcher: asyncio.Task[None] | None = None
        try:
            await self.start_service()
            watcher = asyncio.create_task(_watch(self.observer, self.api, self.cluster, config))
            await self.run_ranks()
            await self.deadline.until(lambda: _diagnosed(timeline, config), "the diagnosis")
            await self.deadline.until(lambda: bool(timeline.actions), "the actions")
            if config.operator:
                await self.run_operator()
            timeline.finished = True
        except DemoTimeoutError as exc:
            timeline.notes.append(f"{exc} (deadline {config.deadline_s:g} s)")
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await self.read_back()
            for child in reversed(self.children):
                await child.stop()
        if not config.operator:
            timeline.notes.append("the operator was not run: nothing carried the actions out")

    async def start_service(self) -> None:
        env = {
            "DIAGNOSER_DATA_DIR": str(self.work_dir / "data"),
            "DIAGNOSER_RULES_WATCH": "false",
            "DIAGNOSER_ACTIONS__DRY_RUN": "false",
        }
        port = self.base_url.rsplit(":", 1)[1]
        service = Child(
            "service",
            diagnoser_command("serve", "--host", "127.0.0.1", "--port", port),
            clean_environment(env),
            self.work_dir,
            log=self.work_dir / "service.log",
        )
        self.children.append(service)
        await service.start()
        await wait_healthy(service, self.base_url, max(1.0, self.deadline.at - time.monotonic()))
        self.timeline.add(
            "service",
            f"diagnoser serve at {self.base_url}: SQLite in {self.work_dir}/data, dry-run off",
        )
        await self.api.put_job(
            self.config.job_id,
            {"namespace": NAMESPACE, "kind": "PyTorchJob", "name": self.config.job_id},
        )

    async def run_ranks(self) -> None:
        config, timeline, observer = self.config, self.timeline, self.observer
        env = clean_environment({})
        ranks = [
            Child(
                f"node-{rank}",
                _rank_command(config, self.base_url, self.work_dir, rank),
                env,
                self.work_dir,
                sink=observer.line,
            )
            for rank in range(config.workers)
        ]
        self.children.extend(ranks)
        for rank in ranks:
            await rank.start()
        timeline.add("ranks", f"{config.workers} ranks started, each under `diagnoser run`")
        await self.deadline.until(
            lambda: (
                len(observer.ranks_up) == config.workers
                or any(r.returncode is not None for r in ranks)
            ),
            "every rank to initialise NCCL",
        )
        (self.work_dir / START_FILE).write_text(f"{time.time() + 0.5:.3f}\n")
        timeline.add("ranks", "every rank initialised NCCL: training starts")
        await self.deadline.until(lambda: all(r.returncode is not None for r in ranks), "the ranks")
        for rank in ranks:
            timeline.exit_codes[rank.who] = await rank.wait()
        codes = ", ".join(f"{who} {code}" for who, code in timeline.exit_codes.items())
        timeline.add("ranks", f"all ranks exited (status: {codes}); their logs are shipped")

    async def run_operator(self) -> None:
        config, timeline, cluster = self.config, self.timeline, self.cluster
        operator = Child(
            "operator",
            diagnoser_command(
                "operator", "--server", self.base_url, "--kubeconfig", str(cluster.kubeconfig_path)
            ),
            clean_environment({}),
            self.work_dir,
            sink=self.observer.line,
        )
        self.children.append(operator)
        await operator.start()
        timeline.operator_ran = True
        timeline.add("operator", f"diagnoser operator started against {cluster.url}")
        await self.deadline.until(
            lambda: _acted(timeline, cluster, config) or operator.returncode is not None,
            "the operator to cordon and restart",
        )
        if not _acted(timeline, cluster, config):
            raise DemoTimeoutError(f"diagnoser operator exited with status {operator.returncode}")
        await operator.stop()
        timeline.add("operator", "diagnoser operator stopped")

    async def read_back(self) -> None:
        """The final state, as the service and the emulator report it."""
        with contextlib.suppress(httpx.HTTPError):
            self.timeline.diagnoses = await self.api.diagnoses(self.config.job_id)
            self.timeline.actions = await self.api.actions(self.config.job_id)
        with contextlib.suppress(httpx.HTTPError):
            self.timeline.nodes = await self.cluster.api.nodes()
            self.timeline.pods = await self.cluster.api.pods()
        await self.api.close()
