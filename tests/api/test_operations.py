"""Operating the service: what the alerts and dashboard read is exported, and the service
rides through its dependencies failing (PostgreSQL restart, Redis down, LLM hung or failing).

One service for the module, on its own PostgreSQL, Redis and scripted LLM, so each test can
stop and start them without touching the suite's shared servers. Tests leave the service
healthy for the next, except the last (its LLM breaker stays open).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import promql_parser
import psycopg
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.store.database import parse_database_url
from diagnoser.store.migrate import upgrade
from tests.llm.scripted_llm import Fail, Held, ScriptedLlm, scripted_llm
from tests.servers import PostgresServer, RedisServer, ServiceProcess, post_text

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
UNKNOWN_FAILURE = (
    "[rank0]: iteration 100/1000 | lm loss 2.3\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 10, in <module>\n'
    "FluxCapacitorError: the flux capacitor drifted out of phase\n"
)
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


T = TypeVar("T")


def poll(read: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str) -> T:
    """`read()` until `done(value)`; the last value in the failure message."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s (last: {value!r})")
        time.sleep(0.1)
        value = read()
    return value


@dataclass
class Stack:
    service: ServiceProcess
    postgres: PostgresServer
    redis: RedisServer
    llm: ScriptedLlm
    database_url: str

    def get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.service.base_url}{path}", params=params, timeout=30)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, as `name{labels}` -> value (labels sorted)."""
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def stream_lines(self, job: str, stream: str) -> int:
        """Lines committed to a stream, read from the database itself."""
        url = self.database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as connection:
            row = connection.execute(
                "SELECT lines FROM log_streams WHERE job_id = %s AND stream = %s", (job, stream)
            ).fetchone()
        return int(row[0]) if row else 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    postgres = PostgresServer()
    postgres.init()
    postgres.start()
    redis_server = RedisServer()
    redis_server.start()
    database_url = postgres.create_database()
    upgrade(parse_database_url(database_url))
    with scripted_llm([Fail(503)]) as llm:
        service = ServiceProcess(
            env={
                "DIAGNOSER_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                "DIAGNOSER_DB__URL": database_url,
                "DIAGNOSER_DB__CONNECT_TIMEOUT_S": "1",
                "DIAGNOSER_REDIS__URL": redis_server.url,
                "DIAGNOSER_REDIS__SOCKET_TIMEOUT_S": "1",
                "DIAGNOSER_RULES_WATCH": "false",
                "DIAGNOSER_LLM__BASE_URL": llm.base_url,
                "DIAGNOSER_LLM__MODEL": "scripted",
                "DIAGNOSER_LLM__QUIET_S": "0",
                "DIAGNOSER_LLM__TIMEOUT_S": "120",
                "DIAGNOSER_LLM__MAX_RETRIES": "0",
                "DIAGNOSER_LLM__BREAKER_FAILURES": "2",
                "DIAGNOSER_LLM__BREAKER_RESET_S": "3600",
                "DIAGNOSER_LLM__LOG_AGENT": "false",
                "DIAGNOSER_ACTIONS__DRY_RUN": "false",
                "DIAGNOSER_ACTIONS__BLAST_RADIUS_PERCENT": "100",
                "DIAGNOSER_ACTIONS__POLL_INTERVAL_S": "0.2",
            }
        )
        service.start()
        try:
            yield Stack(service, postgres, redis_server, llm, database_url)
        finally:
            service.stop()
            redis_server.stop()
            postgres.destroy()


# --- the alerts and the dashboard name only exported metrics ---------------------------------


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects, from its syntax tree (not a regex over text)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next(
                (m.value for m in node.matchers.matchers if m.name == "__name__"), None
            )
            assert name, f"a selector with no metric name in {expr!r}"
            names.add(name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def alert_expressions() -> dict[str, str]:
    rule = yaml.safe_load(RULES.read_text())
    assert rule["kind"] == "PrometheusRule"
    return {
        item["alert"]: item["expr"] for group in rule["spec"]["groups"] for item in group["rules"]
    }


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"{panel['title']} [{target['refId']}]": target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }


def exportable(metrics_text: str) -> set[str]:
    """Every series name the registry's families can produce, labelled ones included even
    before their first sample (the exposition lists each family's TYPE either way)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created", ""),
        "gauge": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_the_alerts_and_dashboard_name_is_exported(stack: Stack) -> None:
    alerts, panels = alert_expressions(), dashboard_expressions()
    assert len(alerts) >= 10
    assert len(panels) >= 20
    exported = exportable(stack.get("/metrics").text)
    missing = {
        where: sorted(promql_metric_names(expr) - exported)
        for where, expr in {**alerts, **panels}.items()
        if promql_metric_names(expr) - exported
    }
    assert missing == {}
    named = set().union(*(promql_metric_names(expr) for expr in {**alerts, **panels}.values()))
    for health in (
        "diagnoser_ingest_lines_total",
        "diagnoser_ingest_lag_seconds",
        "diagnoser_http_requests_total",
        "diagnoser_escalation_oldest_pending_seconds",
        "diagnoser_llm_calls_total",
        "diagnoser_llm_breaker_open",
        "diagnoser_actions_lease_expired",
    ):
        assert health in named, f"{health} is on no alert or panel"


def test_the_extractor_reads_names_not_functions_labels_or_keywords() -> None:
    names = promql_metric_names(
        'sum by (le) (rate(a_bucket{route=~"x_total|y"}[$__rate_interval])) / on() group_left'
        ' sum(b offset 1h) > bool 0 and absent(c) or {__name__="d"} unless max_over_time(e[5m:1m])'
    )
    assert names == {"a_bucket", "b", "c", "d", "e"}


# --- Redis down: degraded, database only, and back -------------------------------------------


def test_redis_down_degrades_to_the_database_and_recovers(stack: Stack) -> None:
    ready = stack.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "redis": "ok"}}
    assert stack.metrics()['diagnoser_dependency_up{dependency="redis"}'] == 1

    stack.redis.stop()
    degraded = stack.get("/readyz")
    assert degraded.status_code == 200, "Redis is optional: still ready"
    assert degraded.json()["status"] == "degraded"
    assert degraded.json()["checks"]["database"] == "ok"
    assert degraded.json()["checks"]["redis"].startswith("redis unreachable")

    # Everything works on the database alone: ingest, diagnosis, the released action, its claim.
    diagnose(stack, "redis-job", "node-r", XID79)
    assert (
        poll(
            stack.metrics, lambda m: m["diagnoser_actions_unclaimed{}"] >= 1, 20, "unclaimed action"
        )['diagnoser_dependency_up{dependency="redis"}']
        == 0
    )
    claimed = httpx.post(
        f"{stack.service.base_url}/v1/actions/claim",
        # A long poll: the gauge above may count an earlier test's action before this cordon is
        # released (seen in CI), so the claim waits for it rather than asking once.
        json={
            "operator_id": "op-gone",
            "kinds": ["cordon_node"],
            "lease_seconds": 5,
            "wait_seconds": 20,
        },
        timeout=30,
    )
    assert claimed.status_code == 200, claimed.text
    (action,) = claimed.json()["actions"]
    assert action["job_id"] == "redis-job"
    # The operator never completes it: the lease runs out, and the gauge says so.
    poll(
        stack.metrics,
        lambda m: m["diagnoser_actions_lease_expired{}"] == 1,
        30,
        "the lapsed lease on /metrics",
    )

    stack.redis.start()
    poll(lambda: stack.get("/readyz").json()["status"], lambda s: s == "ready", 30, "ready")
    client = redis.Redis(port=stack.redis.port)
    try:
        # The relay retried: the action released while Redis was down reaches its stream.
        entries = poll(
            lambda: relayed_ids(client),
            lambda found: str(action["id"]) in found,
            30,
            "the action on the Redis stream",
        )
    finally:
        client.close()
    assert entries
    assert stack.metrics()['diagnoser_dependency_up{dependency="redis"}'] == 1


def relayed_ids(client: redis.Redis) -> set[str]:
    """Action ids on the relay's stream."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange("diagnoser:actions")  # type: ignore[assignment]
    return {fields[b"id"].decode() for _, fields in entries}


# --- PostgreSQL restart: 503 with Retry-After, nothing acknowledged lost ---------------------


def numbered(start: int, count: int) -> str:
    return "".join(
        f"[rank0]: iteration {n}/100000 | lm loss 2.0\n" for n in range(start, start + count)
    )


def test_a_postgres_restart_answers_503_and_loses_nothing_acknowledged(
    stack: Stack, tmp_path: Path
) -> None:
    log = tmp_path / "train.log"
    log.write_text(numbered(0, 2000))
    shipper = subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "ship", str(log), "--follow",
         "--server", stack.service.base_url, "--job", "pg-job", "--node", "gpu-1",
         "--max-request-seconds", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    warnings: list[str] = []
    reader = threading.Thread(target=lambda: warnings.extend(shipper.stderr or []), daemon=True)
    reader.start()
    try:
        poll(lambda: stack.stream_lines("pg-job", "gpu-1"), lambda n: n == 2000, 60, "shipped")
        acknowledged = 0
        first = post_text(stack.service, "pg-job", "direct", numbered(0, 100))
        acknowledged += int(str(first["lines_accepted"]))

        stack.postgres.stop()
        with log.open("a") as handle:
            handle.write(numbered(2000, 3000))
        down = httpx.post(
            f"{stack.service.base_url}/v1/jobs/pg-job/logs",
            params={"node": "direct", "offset": str(first["next_offset"])},
            content=numbered(100, 100).encode(),
            headers={"Content-Type": "text/plain"},
            timeout=30,
        )
        assert down.status_code == 503, down.text
        assert down.headers["Retry-After"] == "2"
        assert down.json()["error"] == "database_unavailable"
        assert stack.get("/readyz").status_code == 503
        assert stack.get("/metrics").status_code == 200, "metrics answer with the database down"
        assert stack.metrics()['diagnoser_dependency_up{dependency="database"}'] == 0
        poll(lambda: "".join(warnings), lambda text: "503" in text, 30, "the shipper told 503")

        stack.postgres.start()
        # No service restart: the same process answers, its pool reconnects.
        poll(lambda: stack.get("/readyz").status_code, lambda s: s == 200, 30, "ready again")
        resent = poll(
            lambda: httpx.post(
                f"{stack.service.base_url}/v1/jobs/pg-job/logs",
                params={"node": "direct", "offset": str(first["next_offset"])},
                content=numbered(100, 100).encode(),
                headers={"Content-Type": "text/plain"},
                timeout=30,
            ),
            lambda answer: answer.status_code == 200,
            30,
            "the direct client's resend",
        )
        acknowledged += int(resent.json()["lines_accepted"])
        poll(lambda: stack.stream_lines("pg-job", "gpu-1"), lambda n: n == 5000, 90, "the rest")
        assert shipper.poll() is None, "the shipper rode through the outage"
    finally:
        shipper.send_signal(signal.SIGTERM)
        shipper.wait(30)
        reader.join(10)
        if shipper.stderr is not None:
            shipper.stderr.close()
    assert stack.stream_lines("pg-job", "direct") == acknowledged == 200
    assert stack.stream_lines("pg-job", "gpu-1") == 5000
    after = stack.metrics()
    assert after['diagnoser_dependency_up{dependency="database"}'] == 1
    assert after["diagnoser_ingest_database_errors_total{}"] >= 1


# --- LLM hung, then failing: ingest goes on, escalations fall back, the breaker trips -------


def diagnose(stack: Stack, job: str, node: str, text: str) -> str:
    """Post `text`; the one diagnosis it created."""
    diagnoses = post_text(stack.service, job, node, text)["diagnoses"]
    assert isinstance(diagnoses, list)
    assert len(diagnoses) == 1, diagnoses
    return str(diagnoses[0])


def diagnosis(stack: Stack, diagnosis_id: str) -> dict[str, Any]:
    body: dict[str, Any] = stack.get(f"/v1/diagnoses/{diagnosis_id}").json()
    return body


def test_a_hung_then_failing_llm_blocks_no_ingest_and_trips_the_breaker(stack: Stack) -> None:
    release = threading.Event()
    stack.llm.script = [Held(release, then=Fail(503))]
    stuck = diagnose(stack, "llm-job", "gpu-1", UNKNOWN_FAILURE)
    try:
        poll(lambda: len(stack.llm.completions), lambda n: n > 0, 30, "the LLM asked")
        # The endpoint hangs on every call; ingest of other jobs goes on meanwhile.
        for node in range(10):
            accepted = post_text(stack.service, "bulk-job", f"n{node}", numbered(0, 1000))
            assert accepted["lines_accepted"] == 1000
        assert stack.llm.answered == 0, "all of that ingest happened while the LLM hung"
        waiting = diagnosis(stack, stuck)
        assert waiting["action"] == "escalate"
        assert not waiting.get("llm"), "the escalation waits"
        assert stack.metrics()["diagnoser_escalations_pending{}"] >= 1
    finally:
        release.set()

    # The held calls fail: the breaker opens, the rules-only diagnosis stays for a person.
    decided = poll(lambda: diagnosis(stack, stuck), lambda d: bool(d.get("llm")), 60, "LLM verdict")
    assert decided["llm"]["decided"] is False
    assert decided["action"] == "escalate"
    assert decided["source"] != "llm"
    metrics = poll(
        stack.metrics, lambda m: m["diagnoser_llm_breaker_open{}"] == 1, 30, "breaker open"
    )
    assert metrics["diagnoser_llm_breaker_trips_total{}"] == 1
    assert metrics['diagnoser_llm_calls_total{outcome="failed"}'] >= 2

    # With the breaker open the next escalation makes no call and falls back at once.
    calls = len(stack.llm.completions)
    refused = diagnose(stack, "llm-job-2", "gpu-1", UNKNOWN_FAILURE.replace("flux", "warp"))
    fallback = poll(lambda: diagnosis(stack, refused), lambda d: bool(d.get("llm")), 60, "fallback")
    assert fallback["llm"]["decided"] is False
    assert fallback["action"] == "escalate"
    assert len(stack.llm.completions) == calls
    after = poll(
        stack.metrics,
        lambda m: m['diagnoser_llm_calls_total{outcome="refused"}'] >= 1,
        30,
        "a refused round",
    )
    assert after["diagnoser_escalations_pending{}"] == 0
