"""Prometheus metrics: one registry per app instance, so tests and replicas never share state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diagnoser.store.backlog import Backlog

DEPENDENCIES = ("database", "redis")


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    backlog: Backlog = field(default_factory=Backlog)
    """Set by the /metrics route just before it renders."""
    dependencies_up: dict[str, bool] = field(default_factory=dict)
    """`database` and (when configured) `redis`: whether each answered at the last scrape."""

    def __post_init__(self) -> None:
        self.http_requests = Counter(
            "diagnoser_http_requests",
            "HTTP requests served, by route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "diagnoser_http_request_duration_seconds",
            "Time from request start to the last byte of the response.",
            ["route"],
            registry=self.registry,
        )
        self.diagnosis_watchers = Gauge(
            "diagnoser_diagnosis_watchers",
            "Clients following GET /v1/diagnoses/stream.",
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """The backlog and dependency gauges, from what the route last measured."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        backlog = self.metrics.backlog
        for name, doc, value in (
            (
                "diagnoser_escalations_pending",
                "Escalations waiting for the LLM stage (database-wide: take max over replicas).",
                backlog.escalations_pending,
            ),
            (
                "diagnoser_escalation_oldest_pending_seconds",
                "Age of the oldest pending escalation; 0 when none waits.",
                backlog.oldest_escalation_s,
            ),
            (
                "diagnoser_actions_unclaimed",
                "Released actions claimable now that no operator has claimed.",
                backlog.actions_unclaimed,
            ),
            (
                "diagnoser_action_oldest_unclaimed_seconds",
                "How long the oldest claimable action has waited for an operator; 0 when none.",
                backlog.oldest_unclaimed_action_s,
            ),
            (
                "diagnoser_actions_lease_expired",
                "Claimed actions whose lease ran out without a completion (operator gone).",
                backlog.actions_lease_expired,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        up = GaugeMetricFamily(
            "diagnoser_dependency_up",
            "1 when the dependency answered at this scrape (database; redis when configured).",
            labels=["dependency"],
        )
        for dependency in DEPENDENCIES:
            if dependency in self.metrics.dependencies_up:
                up.add_metric([dependency], 1 if self.metrics.dependencies_up[dependency] else 0)
        yield up


class PipelineCounts(Protocol):
    """What the pipeline counts in memory anyway; read only when Prometheus scrapes."""

    @property
    def lines(self) -> int: ...
    @property
    def truncated_lines(self) -> int: ...
    @property
    def committed_bytes(self) -> int: ...
    @property
    def duplicate_bytes(self) -> int: ...
    @property
    def rule_events(self) -> Mapping[str, int]: ...
    @property
    def diagnosis_changes(self) -> Mapping[str, int]: ...
    @property
    def hangs(self) -> Mapping[str, int]: ...
    @property
    def jobs_tracked(self) -> int: ...
    @property
    def database_errors(self) -> int: ...
    @property
    def uncommitted_age_s(self) -> float: ...
    @property
    def requests_in_flight(self) -> int: ...


class PipelineCollector(Collector):
    """Exposes the pipeline's own counters at scrape time: nothing is counted twice per line."""

    def __init__(self, counts: PipelineCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        for name, doc, value in (
            ("diagnoser_ingest_lines", "Lines framed and handed to the stages.", counts.lines),
            (
                "diagnoser_ingest_truncated_lines",
                "Lines cut at the length limit.",
                counts.truncated_lines,
            ),
            (
                "diagnoser_ingest_committed_bytes",
                "Stream bytes committed (acknowledged).",
                counts.committed_bytes,
            ),
            (
                "diagnoser_ingest_duplicate_bytes",
                "Resent bytes dropped as already committed.",
                counts.duplicate_bytes,
            ),
            (
                "diagnoser_ingest_database_errors",
                "Stream offset reads and commits that failed (database down or busy); "
                "the clients resend.",
                counts.database_errors,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        events = CounterMetricFamily(
            "diagnoser_rule_events", "Rule matches, repeats included.", labels=["rule"]
        )
        for rule, count in sorted(counts.rule_events.items()):
            events.add_metric([rule], count)
        yield events
        changes = CounterMetricFamily(
            "diagnoser_diagnosis_changes",
            "Diagnoses created or changed, by the action they recommend.",
            labels=["action"],
        )
        for action, count in sorted(counts.diagnosis_changes.items()):
            changes.add_metric([action], count)
        yield changes
        hangs = CounterMetricFamily(
            "diagnoser_hangs",
            "Jobs the hang detector reported, and hangs resolved by progress resuming.",
            labels=["outcome"],
        )
        for outcome in ("reported", "resolved"):
            hangs.add_metric([outcome], counts.hangs.get(outcome, 0))
        yield hangs
        yield GaugeMetricFamily(
            "diagnoser_jobs_tracked",
            "Jobs with live rule state in memory.",
            value=counts.jobs_tracked,
        )
        yield GaugeMetricFamily(
            "diagnoser_ingest_lag_seconds",
            "How long the oldest line framed but not yet committed has waited; 0 when none.",
            value=counts.uncommitted_age_s,
        )
        yield GaugeMetricFamily(
            "diagnoser_ingest_requests_in_flight",
            "Ingest requests being served now (beyond the admission limit: 429).",
            value=counts.requests_in_flight,
        )


class MetricsMiddleware:
    """Counts requests by route template (not raw path: job ids would explode cardinality)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            self.metrics.http_requests.labels(scope["method"], template, str(status)).inc()
            self.metrics.http_latency.labels(template).observe(time.perf_counter() - started)


class LlmStageCounts(Protocol):
    calls_ok: int
    calls_failed: int
    cached: int
    tokens_in: int
    tokens_out: int
    escalations: int
    refused: int
    agreement_buckets: list[int]
    agreement_sum: float
    agreement_count: int


class LlmCollector(Collector):
    """The LLM stage's calls, tokens, cache hits, vote agreement and breaker, at scrape time."""

    def __init__(
        self,
        counts: LlmStageCounts,
        buckets: tuple[float, ...],
        breaker_open: Callable[[], bool],
        breaker_trips: Callable[[], int] = lambda: 0,
    ) -> None:
        self.counts = counts
        self.buckets = buckets
        self.breaker_open = breaker_open
        self.breaker_trips = breaker_trips

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        calls = CounterMetricFamily(
            "diagnoser_llm_calls",
            "LLM completions: ok, failed (HTTP, timeout, connection), cached (none made), or "
            "refused (a round the open breaker let no call out for).",
            labels=["outcome"],
        )
        calls.add_metric(["ok"], counts.calls_ok)
        calls.add_metric(["failed"], counts.calls_failed)
        calls.add_metric(["cached"], counts.cached)
        calls.add_metric(["refused"], counts.refused)
        yield calls
        tokens = CounterMetricFamily(
            "diagnoser_llm_tokens",
            "Tokens sent to and received from the LLM.",
            labels=["direction"],
        )
        tokens.add_metric(["in"], counts.tokens_in)
        tokens.add_metric(["out"], counts.tokens_out)
        yield tokens
        yield CounterMetricFamily(
            "diagnoser_llm_escalations",
            "Inconclusive diagnoses handed to the LLM stage.",
            value=counts.escalations,
        )
        histogram = HistogramMetricFamily(
            "diagnoser_llm_vote_agreement",
            "Share of the k samples that agreed with the winning answer, per round.",
        )
        histogram.add_metric(
            [],
            [
                *((str(b), c) for b, c in zip(self.buckets, counts.agreement_buckets, strict=True)),
                ("+Inf", counts.agreement_count),
            ],
            counts.agreement_sum,
        )
        yield histogram
        yield GaugeMetricFamily(
            "diagnoser_llm_breaker_open",
            "1 while the LLM circuit breaker refuses calls.",
            value=1 if self.breaker_open() else 0,
        )
        yield CounterMetricFamily(
            "diagnoser_llm_breaker_trips",
            "Times the LLM circuit breaker opened (a failed half-open trial re-opens it).",
            value=self.breaker_trips(),
        )


class RetentionCounts(Protocol):
    """What the retention pruner counted (diagnoser/store/retention.py RetentionTotals)."""

    @property
    def rows(self) -> Mapping[str, int]: ...
    @property
    def passes_ok(self) -> int: ...
    @property
    def passes_failed(self) -> int: ...
    @property
    def last_success(self) -> float | None: ...


class RetentionCollector(Collector):
    """Rows the retention pruner deleted, by table, and whether its passes succeed."""

    def __init__(self, counts: RetentionCounts, tables: tuple[str, ...]) -> None:
        self.counts = counts
        self.tables = tables

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        rows = CounterMetricFamily(
            "diagnoser_retention_pruned_rows",
            "Rows deleted by retention (job data past DIAGNOSER_RETENTION__DAYS), by table.",
            labels=["table"],
        )
        for table in self.tables:
            rows.add_metric([table], counts.rows.get(table, 0))
        yield rows
        passes = CounterMetricFamily(
            "diagnoser_retention_passes", "Retention passes, by outcome.", labels=["outcome"]
        )
        passes.add_metric(["ok"], counts.passes_ok)
        passes.add_metric(["failed"], counts.passes_failed)
        yield passes
        if counts.last_success is not None:
            yield GaugeMetricFamily(
                "diagnoser_retention_last_success_timestamp_seconds",
                "Unix time the last retention pass completed.",
                value=counts.last_success,
            )
