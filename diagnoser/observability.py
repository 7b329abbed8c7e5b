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


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

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

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
    agreement_buckets: list[int]
    agreement_sum: float
    agreement_count: int


class LlmCollector(Collector):
    """The LLM stage's calls, tokens, cache hits, vote agreement and breaker, at scrape time."""

    def __init__(
        self, counts: LlmStageCounts, buckets: tuple[float, ...], breaker_open: Callable[[], bool]
    ) -> None:
        self.counts = counts
        self.buckets = buckets
        self.breaker_open = breaker_open

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        calls = CounterMetricFamily(
            "diagnoser_llm_calls",
            "LLM completions: ok, failed (HTTP, timeout, connection), or cached (none made).",
            labels=["outcome"],
        )
        calls.add_metric(["ok"], counts.calls_ok)
        calls.add_metric(["failed"], counts.calls_failed)
        calls.add_metric(["cached"], counts.cached)
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
