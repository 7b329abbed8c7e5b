"""Two `diagnoser serve` replicas on one real PostgreSQL and Redis behave as one service.

The streams of one job land on different replicas: one diagnosis, one cordon claimed once, one
hang judged by the job's owner with the other replica's progress in view. Then `kill -9` of a
replica while real shippers stream: they move to the survivor, every line is committed once,
and the survivor takes the job's lease and serves the dead replica's action lease.

The last test kills a module server: it stays last. Waiting is polling with a deadline.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from redis import Redis

from diagnoser.store.database import parse_database_url
from diagnoser.store.migrate import upgrade
from tests.servers import PostgresServer, RedisServer, ServiceProcess
from tests.servers import post_text as send

T = TypeVar("T")
LEASE_S = 1.2
WINDOW_S = 3.0
"""Far longer than the activity the replicas share every LEASE_S / 3 can lag on a loaded machine."""
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
TIMEOUT = (
    "[rank{rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, "
    "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n"
)


def steps(first: int, last: int) -> str:
    return "".join(
        f" iteration {i:>6}/  500000 | consumed samples: {i * 128:>10} | lm loss: 2.41E+00 |\n"
        for i in range(first, last + 1)
    )


@dataclass
class Replicas:
    a: ServiceProcess
    b: ServiceProcess
    dsn: str

    def owner(self, job: str) -> tuple[str, datetime] | None:
        """The job's lease holder and until when, as the database has it."""
        with psycopg.connect(self.dsn) as connection:
            row = connection.execute(
                "SELECT owner, lease_until FROM job_owners WHERE job_id = %s", (job,)
            ).fetchone()
        return None if row is None else (str(row[0]), row[1])

    def lease_until(self, job: str) -> datetime:
        owner = self.owner(job)
        assert owner is not None
        return owner[1]


@pytest.fixture(scope="module")
def replicas(
    postgres_server: PostgresServer,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    url = postgres_server.create_database()
    upgrade(parse_database_url(url))
    common = {
        "DIAGNOSER_DB__URL": url,
        "DIAGNOSER_REDIS__URL": redis_server.url,
        "DIAGNOSER_REPLICA__LEASE_S": str(LEASE_S),
        "DIAGNOSER_HANG__TIMEOUT_S": str(WINDOW_S),
        "DIAGNOSER_HANG__CHECK_INTERVAL_S": "0.2",
        "DIAGNOSER_ACTIONS__DRY_RUN": "false",
        "DIAGNOSER_ACTIONS__BLAST_RADIUS_PERCENT": "100",
        "DIAGNOSER_ACTIONS__POLL_INTERVAL_S": "0.2",
    }
    started = []
    try:
        for name in ("a", "b"):
            data = tmp_path_factory.mktemp(f"replica-{name}")
            env = {**common, "DIAGNOSER_DATA_DIR": str(data), "DIAGNOSER_REPLICA__ID": name}
            process = ServiceProcess(env=env)
            process.start()
            started.append(process)
        yield Replicas(started[0], started[1], url.replace("+psycopg", ""))
    finally:
        for process in started:
            process.stop()


def poll(probe: Callable[[], T], ready: Callable[[T], bool], what: str, timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if ready(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {found!r} after {timeout} s")
        time.sleep(0.1)


def diagnoses(service: ServiceProcess, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses").json()[
        "diagnoses"
    ]
    return items


def actions(service: ServiceProcess, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = httpx.get(
        f"{service.base_url}/v1/actions", params={"job_id": job}
    ).json()["items"]
    return items


def claim_one(service: ServiceProcess, operator: str, **body: Any) -> dict[str, Any]:
    """The one action a long-polled claim gets, claiming again until a deadline: on a loaded
    machine the diagnosis that releases the action may come later than one poll."""
    deadline = time.monotonic() + 120
    while True:
        claimed = claim(service, operator, wait_seconds=20, **body)
        if claimed or time.monotonic() > deadline:
            (action,) = claimed
            return action


def claim(service: ServiceProcess, operator: str, **body: Any) -> list[dict[str, Any]]:
    answer = httpx.post(
        f"{service.base_url}/v1/actions/claim",
        json={"operator_id": operator, **body},
        timeout=40,
    )
    assert answer.status_code == 200, answer.text
    claimed: list[dict[str, Any]] = answer.json()["actions"]
    return claimed


def event(service: ServiceProcess, job: str, kind: str) -> None:
    response = httpx.post(f"{service.base_url}/v1/jobs/{job}/events", json={"type": kind})
    assert response.status_code == 201, response.text


def hangs_reported(service: ServiceProcess) -> float:
    for line in httpx.get(f"{service.base_url}/metrics").text.splitlines():
        if line.startswith('diagnoser_hangs_total{outcome="reported"}'):
            return float(line.split()[-1])
    return 0.0


def at_once(*calls: Callable[[], object]) -> list[object]:
    """Run the calls in threads released together: the replicas get them at the same time."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(index: int, call: Callable[[], object]) -> None:
        barrier.wait()
        results[index] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_a_job_split_over_two_replicas_gets_one_diagnosis_and_one_cordon(
    replicas: Replicas,
) -> None:
    """Node 1's timeouts reach replica A while node 3's Xid 79 reaches B, at the same moment:
    one diagnosis naming node 3, one cordon, claimed by one of two operators polling the two
    replicas, and added to the Redis stream once."""
    a, b = replicas.a, replicas.b
    job = "split-1"
    at_once(
        lambda: send(a, job, "node-1", "".join(TIMEOUT.format(rank=r) for r in range(8))),
        lambda: send(b, job, "node-3", XID79),
    )
    found = poll(
        lambda: diagnoses(a, job),
        lambda d: bool(d) and d[0]["action"] == "cordon_node_and_restart",
        "the job's diagnosis",
    )
    assert len(found) == 1
    assert found[0]["culprit_nodes"] == ["node-3"]
    assert [d["id"] for d in diagnoses(b, job)] == [found[0]["id"]]
    cordons = [x for x in actions(b, job) if x["kind"] == "cordon_node"]
    assert [(x["target"]["node"], x["state"]) for x in cordons] == [("node-3", "pending")]

    got = at_once(
        lambda: claim(a, "op-a", kinds=["cordon_node"], wait_seconds=5),
        lambda: claim(b, "op-b", kinds=["cordon_node"], wait_seconds=5),
    )
    assert sorted(len(x) for x in got if isinstance(x, list)) == [0, 1]
    redis = Redis.from_url(str(a.env["DIAGNOSER_REDIS__URL"]))

    def entries() -> list[dict[bytes, bytes]]:
        added: list[tuple[bytes, dict[bytes, bytes]]] = redis.xrange("diagnoser:actions")  # type: ignore[assignment]
        return [fields for _, fields in added if job.encode() in fields[b"action"]]

    try:
        stream = poll(
            entries,
            lambda found: any(f[b"kind"] == b"cordon_node" for f in found),
            "the cordon in the Redis stream",
        )
    finally:
        redis.close()
    assert [f[b"id"] for f in stream].count(str(cordons[0]["id"]).encode()) == 1


def test_the_job_s_owner_judges_its_stall_once_with_the_other_replica_s_progress(
    replicas: Replicas,
) -> None:
    """A owns the job; its own stream goes quiet while B's stream of the job keeps stepping:
    no hang. When B's stops too, one hang (not one per replica); B's progress resolves it."""
    a, b = replicas.a, replicas.b
    job = "stall-1"
    event(a, job, "started")
    send(a, job, "node-1", steps(1, 5))
    poll(lambda: replicas.owner(job), lambda o: o is not None and o[0] == "a", "A's lease")
    quiet_since = time.monotonic()
    step = 6
    while time.monotonic() - quiet_since < 2 * WINDOW_S:  # the load: B steps, A is quiet
        send(b, job, "node-2", steps(step, step))
        step += 1
        early = diagnoses(a, job)
        assert early == [], f"a hang while the job made progress on B: {early}"
        time.sleep(0.3)
    (hang,) = poll(lambda: diagnoses(a, job), bool, "the hang")
    assert (hang["failure_type"], hang["status"]) == ("hang", "open")
    lease = replicas.lease_until(job)
    for _ in range(2):  # B's detector has looked many times meanwhile (every 0.2 s)
        lease = poll(lambda: replicas.lease_until(job), lease.__lt__, "a lease renewal")
    assert [d["id"] for d in diagnoses(b, job)] == [hang["id"]]
    assert hangs_reported(a) + hangs_reported(b) == 1

    send(b, job, "node-2", steps(step, step + 1))
    resolved = poll(
        lambda: diagnoses(a, job), lambda d: d[0]["status"] == "resolved", "the resolve"
    )
    assert [d["id"] for d in resolved] == [hang["id"]]


@dataclass
class Stream:
    """A log file a test appends to, and the real shipper following it."""

    node: str
    path: Path
    servers: tuple[ServiceProcess, ...]
    sent: int = 0
    process: subprocess.Popen[bytes] | None = None

    def write(self, count: int, text: str = "") -> None:
        with self.path.open("a") as log:
            for _ in range(count):
                self.sent += 1
                log.write(f"{self.node} step {self.sent:07d} loss 2.4{self.sent % 10}\n")
            log.write(text)
            self.sent += text.count("\n")

    def ship(self, job: str) -> None:
        urls = [arg for s in self.servers for arg in ("--server", s.base_url)]
        command = [sys.executable, "-m", "diagnoser", "ship", str(self.path), "--follow"]
        with self.path.with_suffix(".err").open("wb") as err:  # the child keeps its copy
            self.process = subprocess.Popen(
                [*command, *urls, "--job", job, "--node", self.node, "--max-request-seconds", "1"],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def state(self, service: ServiceProcess, job: str) -> dict[str, int]:
        answer = httpx.get(f"{service.base_url}/v1/jobs/{job}/logs", params={"node": self.node})
        if answer.status_code == 404:
            return {"lines": 0, "committed_offset": 0}
        body: dict[str, int] = answer.json()
        return body

    def stop(self) -> int | None:
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        self.process = None
        return code


def test_kill_9_of_a_replica_mid_stream_loses_and_doubles_nothing(
    replicas: Replicas, tmp_path: Path
) -> None:
    """B owns the job and holds an operator's cordon lease; two shippers stream, one through
    B. `kill -9` B mid-stream: that shipper moves to A, and per stream the lines committed are
    the lines written; A takes the job's lease and the operator completes its cordon on A."""
    a, b = replicas.a, replicas.b
    job = "killed-1"
    through_b = Stream("node-1", tmp_path / "node-1.log", (b, a))
    through_a = Stream("node-2", tmp_path / "node-2.log", (a, b))
    event(b, job, "started")
    through_b.write(200, XID79)
    through_b.ship(job)
    try:
        poll(lambda: replicas.owner(job), lambda o: o is not None and o[0] == "b", "B's lease")
        cordon = claim_one(b, "op-k", kinds=["cordon_node"])
        assert cordon["job_id"] == job
        through_a.write(200)
        through_a.ship(job)
        for _ in range(5):  # the load, while B is alive
            through_b.write(400)
            through_a.write(400)
            time.sleep(0.1)
        poll(lambda: through_b.state(a, job)["lines"], lambda n: n > 1000, "B's first commits")
        through_b.write(300, "a partial line, its newline still to come")
        assert b.process is not None
        b.process.send_signal(signal.SIGKILL)  # kill -9, mid-stream
        b.process.wait(15)
        b.process = None
        with through_b.path.open("a") as log:
            log.write(" ... and here it is\n")
        through_b.sent += 1
        for _ in range(5):  # the load goes on, through A alone
            through_b.write(400)
            through_a.write(400)
            time.sleep(0.1)
        for stream in (through_b, through_a):
            size = stream.path.stat().st_size
            state = poll(
                partial(stream.state, a, job),
                lambda st: st["committed_offset"] >= size,  # noqa: B023 (used at once)
                f"{stream.node} committed to the end",
            )
            assert (stream.node, state["lines"], state["committed_offset"]) == (
                stream.node,
                stream.sent,
                size,
            )
    finally:
        codes = [through_b.stop(), through_a.stop()]
    assert codes == [0, 0], (through_b.path.with_suffix(".err").read_text())[-2000:]
    assert "switching to" in through_b.path.with_suffix(".err").read_text()
    owner = poll(lambda: replicas.owner(job), lambda o: o is not None and o[0] == "a", "A's lease")
    assert owner is not None
    done = httpx.post(
        f"{a.base_url}/v1/actions/{cordon['id']}/complete",
        json={"operator_id": "op-k", "status": "done", "message": "cordoned"},
    )
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "done"
