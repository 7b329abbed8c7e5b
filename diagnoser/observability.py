"""Prometheus metrics: one registry per app instance, so tests and replicas never share state."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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
