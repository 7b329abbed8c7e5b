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
from diagnoser.store.migrate import current_revision

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: Literal["ok"]
    version: str


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
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
    except Exception as exc:  # any client error means "not ready"
        return f"redis unreachable: {type(exc).__name__}: {str(exc)[:200]}"
    return None


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "a dependency does not answer"}},
)
async def readyz(resources: ResourcesDep) -> JSONResponse:
    """Ready: the database (and Redis, when configured) answer now. 503 with reasons if not."""
    database, redis = await asyncio.gather(_check_database(resources), _check_redis(resources))
    checks = {"database": database or "ok"}
    if resources.redis is not None:
        checks["redis"] = redis or "ok"
    ready = database is None and redis is None
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(resources: ResourcesDep) -> Response:
    """Prometheus text exposition format."""
    return Response(resources.metrics.render(), media_type=CONTENT_TYPE_LATEST)
