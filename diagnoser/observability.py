"""Prometheus metrics: one registry per app instance, so tests and replicas never share state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
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
