"""Liveness, readiness and metrics: what a load balancer and Prometheus ask."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from sqlalchemy import text

from diagnoser import __version__
from diagnoser.api.deps import Resources, ResourcesDep
from diagnoser.store.backlog import measure
from diagnoser.store.migrate import current_revision

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: Literal["ok"]
    version: str


class Readiness(BaseModel):
    status: Literal["ready", "degraded", "unavailable"]
    """`degraded`: ready (200), but an optional dependency (Redis) is down and the service runs
    on the database alone until it returns."""
    checks: dict[str, str]
    """`ok` or the reason, per dependency (`database`, and `redis` when configured)."""


@router.get("/healthz", response_model=Liveness)
async def healthz() -> Liveness:
    """Alive: the process answers. Says nothing about its dependencies."""
    return Liveness(status="ok", version=__version__)


async def _check_database(resources: Resources) -> str | None:
    timeout = resources.settings.db.connect_timeout_s + 1
    try:
        async with asyncio.timeout(timeout), resources.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
            revision = await connection.run_sync(current_revision)
    except TimeoutError:
        return f"database did not answer within {timeout:.0f}s"
    except Exception as exc:  # any driver error means "not ready"; the reason is reported
        return f"database unreachable: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if revision != resources.schema_head:
        return (
            f"database schema is at revision {revision or 'none'}, expected "
            f"{resources.schema_head}: run `diagnoser migrate`"
        )
    return None


async def _check_redis(resources: Resources) -> str | None:
    if resources.redis is None:
        return None
    try:
        async with asyncio.timeout(resources.settings.redis.socket_timeout_s + 1):
            await resources.redis.ping()
    except Exception as exc:  # any client error: degraded, the database answers without it
        return (
            f"redis unreachable: {type(exc).__name__}: {str(exc)[:200]} "
            "(degraded: running on the database alone)"
        )
    return None


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "the database does not answer"}},
)
async def readyz(resources: ResourcesDep) -> JSONResponse:
    """Ready: the database answers now (503 with the reason if not).

    Redis is an accelerator (verdict cache, the action stream's copy): while it is down the
    service answers `degraded` with 200, since every request still succeeds on the database
    alone, and taking every replica out of its Service for it would turn a slowdown into an
    outage.
    """
    database, redis = await asyncio.gather(_check_database(resources), _check_redis(resources))
    checks = {"database": database or "ok"}
    if resources.redis is not None:
        checks["redis"] = redis or "ok"
    status = "unavailable" if database is not None else "degraded" if redis else "ready"
    return JSONResponse(
        {"status": status, "checks": checks},
        status_code=503 if database is not None else 200,
    )


async def _measure_backlog(resources: Resources) -> bool:
    """Read the shared backlog into the gauges; False (last values kept) if the database fails."""
    try:
        async with (
            asyncio.timeout(resources.settings.db.connect_timeout_s + 1),
            resources.sessions() as session,
        ):
            resources.metrics.backlog = await measure(session)
    except Exception:  # any driver error: the database is down for this scrape
        return False
    return True


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(resources: ResourcesDep) -> Response:
    """Prometheus text exposition format.

    Each scrape also reads the backlog from the database and pings Redis (both bounded by
    their timeouts), so the gauges say what holds now, and `diagnoser_dependency_up` says
    whether each answered.
    """
    database, redis = await asyncio.gather(_measure_backlog(resources), _check_redis(resources))
    up = resources.metrics.dependencies_up
    up["database"] = database
    if resources.redis is not None:
        up["redis"] = redis is None
    return Response(resources.metrics.render(), media_type=CONTENT_TYPE_LATEST)
