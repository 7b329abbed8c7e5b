"""Resources built once by the app's lifespan and handed to routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from diagnoser.config import Settings
from diagnoser.diagnosis.flow import DiagnosisFlow
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.ingest.admission import Admission
from diagnoser.ingest.writer import StreamWriter
from diagnoser.observability import Metrics
from diagnoser.pipeline import Pipeline
from diagnoser.reload import RuleReloader
from diagnoser.store.database import DatabaseUrl, Sessions


@dataclass(frozen=True, slots=True)
class Resources:
    settings: Settings
    database: DatabaseUrl
    engine: AsyncEngine
    sessions: Sessions
    redis: Redis | None
    metrics: Metrics
    schema_head: str
    pipeline: Pipeline
    writer: StreamWriter
    admission: Admission
    reloader: RuleReloader
    hub: DiagnosisHub
    flow: DiagnosisFlow
    """The diagnosis flow; lifecycle events (a start, an exit) are told to it."""


def get_resources(request: Request) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]
NAME_PATTERN = r"^[A-Za-z0-9][\w.:@-]*$"
"""Job ids and node names: what Kubernetes and schedulers use, nothing that needs escaping."""
JobId = Annotated[str, Path(min_length=1, max_length=253, pattern=NAME_PATTERN)]
