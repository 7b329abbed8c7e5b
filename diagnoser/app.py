"""The HTTP composition root: `create_app(settings)` builds every resource once, in the lifespan."""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.middleware import Middleware
from uvicorn.config import LOGGING_CONFIG

from diagnoser import __version__
from diagnoser.actions.notifier import NotifyWorker
from diagnoser.actions.policy import PolicyConfig
from diagnoser.actions.publisher import ActionPublisher, ActionWake
from diagnoser.api import (
    access,
    actions,
    compression,
    diagnoses,
    errors,
    health,
    jobs,
    limits,
    logs,
    nodes,
    rules,
)
from diagnoser.api.deps import Resources
from diagnoser.auth.roles import Gate, authorize, check_start, document
from diagnoser.config import Settings
from diagnoser.diagnosis.escalation import AGREEMENT_BUCKETS, Escalator
from diagnoser.diagnosis.flow import DiagnosisFlow
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.ownership import JobOwnership
from diagnoser.ingest.admission import Admission
from diagnoser.ingest.writer import StreamLocks, StreamWriter
from diagnoser.llm.breaker import BreakerState, CircuitBreaker
from diagnoser.llm.cache import VerdictCache
from diagnoser.llm.client import LlmClient
from diagnoser.llm.redaction import Redactor
from diagnoser.observability import (
    LlmCollector,
    Metrics,
    MetricsMiddleware,
    PipelineCollector,
    RetentionCollector,
)
from diagnoser.pipeline import LineCounter, Pipeline
from diagnoser.reload import RuleReloader
from diagnoser.rules import Action, RuleRegistry, RuleSet
from diagnoser.store.action_queue import StoreActionQueue
from diagnoser.store.database import (
    DatabaseUrl,
    Sessions,
    create_service_engine,
    parse_database_url,
)
from diagnoser.store.filters import FilterStore
from diagnoser.store.kept_lines import KeptLineStore
from diagnoser.store.migrate import head_revision, upgrade
from diagnoser.store.retention import TABLES as RETENTION_TABLES
from diagnoser.store.retention import Pruner
from diagnoser.templates.compressor import CompressorConfig
from diagnoser.templates.log_agent import LogAgent, LogAgentPrompt
from diagnoser.templates.stage import CompressionStage

logger = logging.getLogger(__name__)

FILTER_SYNC_INTERVAL_S = 2.0
"""How often learned filters reach the database and other replicas' changes come back."""


@dataclass(frozen=True, slots=True)
class _Counts:
    """The pipeline's in-memory counters, as /metrics reads them (observability.PipelineCounts)."""

    counter: LineCounter
    writer: StreamWriter
    stage: DiagnosisStage
    flow: DiagnosisFlow
    admission: Admission

    @property
    def lines(self) -> int:
        return self.counter.lines

    @property
    def truncated_lines(self) -> int:
        return self.counter.truncated

    @property
    def committed_bytes(self) -> int:
        return self.writer.totals.committed_bytes

    @property
    def duplicate_bytes(self) -> int:
        return self.writer.totals.duplicate_bytes

    @property
    def rule_events(self) -> Mapping[str, int]:
        return self.stage.events_by_rule

    @property
    def diagnosis_changes(self) -> Mapping[str, int]:
        return self.flow.changes_by_action

    @property
    def hangs(self) -> Mapping[str, int]:
        return self.flow.hangs

    @property
    def jobs_tracked(self) -> int:
        return len(self.stage.jobs)

    @property
    def database_errors(self) -> int:
        return self.writer.totals.database_errors

    @property
    def uncommitted_age_s(self) -> float:
        return self.writer.uncommitted_age_s()

    @property
    def requests_in_flight(self) -> int:
        return self.admission.in_flight


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging, with the service's own loggers (`diagnoser.*`) on the same handler.

    Without it their records (rule reloads, a rejected pack) reach no handler at all.
    """
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["diagnoser"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config


def _llm_stage(
    settings: Settings,
    sessions: Sessions,
    redis: Redis | None,
    flow: DiagnosisFlow,
    metrics: Metrics,
) -> tuple[LlmClient, LlmCollector] | None:
    """Build the LLM stage when an endpoint is configured: the flow escalates to it."""
    if not settings.llm.enabled:
        return None
    client = LlmClient(
        settings.llm, CircuitBreaker(settings.llm.breaker_failures, settings.llm.breaker_reset_s)
    )
    flow.escalator = Escalator(
        sessions, client, VerdictCache(sessions, redis), settings.llm, flow.apply_llm
    )
    breaker = client.breaker
    collector = LlmCollector(
        flow.escalator.counts,
        AGREEMENT_BUCKETS,
        lambda: breaker.state is BreakerState.OPEN,
        lambda: breaker.trips,
    )
    metrics.registry.register(collector)
    return client, collector


def _start_log_agent(
    background: anyio.abc.TaskGroup,
    settings: Settings,
    llm: tuple[LlmClient, LlmCollector] | None,
    stage: CompressionStage,
) -> None:
    """The LLM filter proposer, off the ingest path: a bounded queue, one worker, a sweep of
    every family's pending templates. Its filters are validated like any other (proposer
    `llm`) and reach the database with the next filter sync."""
    if llm is None or not settings.llm.log_agent:
        return
    client = llm[0]
    redactor = Redactor(settings.llm.redact_patterns)
    prompt = LogAgentPrompt(settings.llm.prompts_dir, redactor=redactor)
    agent = LogAgent(client, prompt, k=settings.llm.samples, temperature=settings.llm.temperature)
    background.start_soon(agent.run)
    background.start_soon(
        agent.watch, lambda: list(stage.families.values()), settings.llm.log_agent_interval_s
    )


def _start_workers(
    background: anyio.abc.TaskGroup,
    settings: Settings,
    sessions: Sessions,
    flow: DiagnosisFlow,
    publisher: ActionPublisher,
    llm: tuple[LlmClient, LlmCollector] | None,
    stage: CompressionStage,
    metrics: Metrics,
) -> None:
    """The background workers beside ingest: the LLM escalator and Log Agent (when an LLM is
    configured), the action relay, the webhook notifier (when a destination is), and
    retention (when an age is set)."""
    if flow.escalator is not None:
        background.start_soon(flow.escalator.run)
    background.start_soon(publisher.run, settings.actions.poll_interval_s)
    if flow.ownership is not None:
        background.start_soon(flow.ownership.run)
    _start_log_agent(background, settings, llm, stage)
    _start_notifier(background, settings, sessions, publisher.wake)
    if settings.retention.enabled:
        background.start_soon(_prune, Pruner(sessions, settings.retention), metrics)


async def _prune(pruner: Pruner, metrics: Metrics) -> None:
    """Retention passes until shutdown, their counts on /metrics meanwhile."""
    collector = RetentionCollector(pruner.totals, RETENTION_TABLES)
    metrics.registry.register(collector)
    try:
        await pruner.watch()
    finally:
        metrics.registry.unregister(collector)


def _start_notifier(
    background: anyio.abc.TaskGroup,
    settings: Settings,
    sessions: Sessions,
    wake: ActionWake,
) -> None:
    """The built-in webhook notifier claims `notify` actions from the outbox, only when a
    destination is configured (otherwise an operator or a person takes them)."""
    if not settings.notify.destinations:
        return
    queue = StoreActionQueue(
        sessions,
        PolicyConfig.from_settings(settings.actions, settings.llm.min_agreement),
        settings.actions.max_attempts,
        wake.notify,
    )
    background.start_soon(NotifyWorker(queue, settings.notify).run, asyncio.Event())


def _flow(
    settings: Settings,
    sessions: Sessions,
    stage: DiagnosisStage,
    hub: DiagnosisHub,
    redis: Redis | None,
    database: DatabaseUrl,
) -> tuple[DiagnosisFlow, ActionPublisher]:
    """The flow judges plans by the configured action policy and wakes claimers after its
    commits, and judges the stalls of the jobs this replica owns; the publisher relays
    released actions to Redis."""
    flow = DiagnosisFlow(sessions, stage, hub)
    flow.ownership = _ownership(settings, database, sessions, stage)
    wake = ActionWake()
    flow.action_policy = PolicyConfig.from_settings(settings.actions, settings.llm.min_agreement)
    flow.actions_changed = wake.notify
    return flow, ActionPublisher(sessions, redis, wake)


def _connect(
    settings: Settings, database: DatabaseUrl
) -> tuple[AsyncEngine, Redis | None, Sessions]:
    """The database engine and sessions, and Redis when configured (nothing connects yet)."""
    engine = create_service_engine(
        database,
        pool_size=settings.db.pool_size,
        connect_timeout_s=settings.db.connect_timeout_s,
        echo=settings.db.echo,
    )
    redis = (
        Redis.from_url(
            settings.redis.url,
            socket_timeout=settings.redis.socket_timeout_s,
            socket_connect_timeout=settings.redis.socket_timeout_s,
        )
        if settings.redis.url
        else None
    )
    return (
        engine,
        redis,
        Sessions(engine, database, connect_timeout_s=settings.db.connect_timeout_s),
    )


async def _gate(settings: Settings, sessions: Sessions) -> Gate:
    """Refuse to run open off loopback; warn loudly when running open on it."""
    await check_start(settings, sessions)
    return Gate(settings.auth, settings.host, sessions)


def _ownership(
    settings: Settings, database: DatabaseUrl, sessions: Sessions, stage: DiagnosisStage
) -> JobOwnership | None:
    """Job leases on PostgreSQL, where replicas share the database; the embedded SQLite
    service is one process and judges every job it sees (docs/scale-out.md)."""
    if database.backend != "postgresql":
        return None
    replica = settings.replica.id or f"{socket.gethostname()}:{os.getpid()}"
    return JobOwnership(sessions, stage, replica, settings.replica.lease_s)


async def _close(sessions: Sessions, ownership: JobOwnership | None) -> None:
    """A clean stop hands this replica's jobs over at once (a failure leaves the leases to run
    out), then closes the database."""
    if ownership is not None:
        try:
            with anyio.fail_after(5):
                await ownership.release()
        except Exception:
            logger.warning(
                "could not release job leases; they run out by themselves", exc_info=True
            )
    await sessions.close()


def create_app(settings: Settings, *, rules: RuleSet | None = None) -> FastAPI:
    database = parse_database_url(settings.database_url)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if database.backend == "sqlite":
            # The embedded default owns its file: migrate it here. PostgreSQL is shared by
            # replicas, so there migration is the explicit `diagnoser migrate` step.
            await anyio.to_thread.run_sync(upgrade, database)
        engine, redis, sessions = _connect(settings, database)
        app.state.gate = await _gate(settings, sessions)
        registry = await anyio.to_thread.run_sync(
            functools.partial(RuleRegistry, settings.rules_dir, compiled=rules)
        )
        reloader = RuleReloader(registry)
        compression_stage = CompressionStage(registry, CompressorConfig(build_in_thread=True))
        stage = DiagnosisStage(
            registry,
            hang_action=Action(settings.hang.action),
            signals=settings.signals.config(),
            loss_reads=compression_stage.share_loss_reads(),
        )
        counter = LineCounter()
        pipeline = Pipeline([counter, compression_stage, stage])
        filter_store = FilterStore(sessions, compression_stage)
        kept_lines = KeptLineStore(sessions, compression_stage)
        hub = DiagnosisHub()
        metrics.diagnosis_watchers.set_function(lambda: hub.watchers)
        flow, publisher = _flow(settings, sessions, stage, hub, redis, database)
        writer = StreamWriter(
            sessions,
            pipeline,
            settings.ingest,
            StreamLocks(),
            after_commit=lambda key: flow.settle(key.job_id),
            urgent=lambda key: stage.awaits_settle(key.job_id),
            sole_writer=database.backend == "sqlite",
        )
        admission = Admission(settings.ingest.max_concurrent_requests)
        metrics.registry.register(
            collector := PipelineCollector(_Counts(counter, writer, stage, flow, admission))
        )
        llm = _llm_stage(settings, sessions, redis, flow, metrics)
        app.state.resources = Resources(
            settings=settings,
            database=database,
            engine=engine,
            sessions=sessions,
            redis=redis,
            metrics=metrics,
            schema_head=head_revision(),
            pipeline=pipeline,
            writer=writer,
            admission=admission,
            reloader=reloader,
            hub=hub,
            flow=flow,
            compression=compression_stage,
            filters=filter_store,
            kept_lines=kept_lines,
            action_wake=publisher.wake,
        )
        stop_watching = anyio.Event()
        try:
            async with anyio.create_task_group() as background:
                if settings.rules_watch:
                    background.start_soon(reloader.watch, stop_watching)
                background.start_soon(
                    flow.watch_stalls, settings.hang.timeout_s, settings.hang.check_interval_s
                )
                background.start_soon(filter_store.watch, FILTER_SYNC_INTERVAL_S)
                background.start_soon(kept_lines.watch, FILTER_SYNC_INTERVAL_S)
                _start_workers(
                    background, settings, sessions, flow, publisher, llm, compression_stage, metrics
                )
                try:
                    yield
                finally:
                    stop_watching.set()
                    background.cancel_scope.cancel()
        finally:
            if redis is not None:
                await redis.aclose()
            metrics.registry.unregister(collector)
            if llm is not None:
                metrics.registry.unregister(llm[1])
                await llm[0].aclose()
            await _close(sessions, flow.ownership)

    # /docs and /redoc with their scripts served by this process: offline clusters see them too.
    app = FastAPIOffline(
        title="diagnoser",
        version=__version__,
        summary="Log diagnosis for GPU training clusters: ingest, rules, LLM, recovery actions.",
        lifespan=lifespan,
        dependencies=[Depends(authorize)],  # the one route -> role table: diagnoser/auth/roles.py
        middleware=[Middleware(limits.LimitsMiddleware, limits=settings.limits)],
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    _install_routes(app, settings)
    return app


def _install_routes(app: FastAPI, settings: Settings) -> None:
    """The routers, the error bodies, and what the document says about authentication."""
    errors.install(app)
    document(app, settings.auth)
    for module in (health, logs, jobs, compression, rules, diagnoses, nodes, actions, access):
        app.include_router(module.router, responses=errors.responses(401, 403))
