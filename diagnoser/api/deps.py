"""Resources built once by the app's lifespan and handed to routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from diagnoser.actions.publisher import ActionWake
from diagnoser.config import Settings
from diagnoser.diagnosis.flow import DiagnosisFlow
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.ingest.admission import Admission
from diagnoser.ingest.schemas import MAX_NAME_LENGTH, NAME_PATTERN, DateTimeText
from diagnoser.ingest.writer import StreamWriter
from diagnoser.observability import Metrics
from diagnoser.pipeline import Pipeline
from diagnoser.reload import RuleReloader
from diagnoser.store.database import DatabaseUrl, Sessions
from diagnoser.store.filters import FilterStore
from diagnoser.store.kept_lines import KeptLineStore
from diagnoser.templates.stage import CompressionStage


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
    compression: CompressionStage
    """The compression stage: each job's compressed log, its family's templates and filters."""
    filters: FilterStore
    kept_lines: KeptLineStore
    """Each job's compressed log and counts in the database: what every replica serves."""
    action_wake: ActionWake
    """Wakes claim long polls and the action stream when actions change in this process."""


async def get_resources(request: Request) -> Resources:
    """Async although it awaits nothing: FastAPI runs a plain `def` dependency in its thread
    pool, a hop to a worker thread and back on every request (for ingest, thousands a
    second) to read one attribute."""
    resources: Resources = request.app.state.resources
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]
JobId = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
NodePath = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
DiagnosisId = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
"""A UUID when it names a diagnosis; any other id is checked like a job id, then not found."""
NameFilter = Annotated[
    str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)
]
"""An optional job or node filter: the same rule as the ids it matches."""
SinceQuery = Annotated[DateTimeText | None, Query(description="RFC 3339; no zone means UTC.")]
CursorQuery = Annotated[
    str | None,
    Query(
        max_length=1024,
        pattern=r"^([A-Za-z0-9_-]+={0,2})?$",
        description="`next_cursor` of the previous page; empty or absent for the first.",
    ),
]
