"""The ingest API's contracts: what clients send and what they get back."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][\w.:@/-]*$")]


class IngestResult(BaseModel):
    job_id: str
    stream: str
    lines_accepted: int
    duplicate_bytes: int = Field(description="Bytes already committed by an earlier request.")
    truncated_lines: int = Field(description="Lines cut at the length limit.")
    next_offset: int = Field(description="Committed offset: where this stream's next byte goes.")
    diagnoses: list[str] = Field(default_factory=list, description="Diagnoses this body triggered.")
    warnings: list[str] = Field(
        default_factory=list,
        description="What the client probably did not mean, e.g. an empty body (no lines).",
    )


class StreamStatus(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job_id: str
    stream: str
    node: str
    rank: int | None
    committed_offset: int
    lines: int
    truncated_lines: int
    updated_at: datetime


class JobMetadata(BaseModel):
    """Set at first contact (headers or PUT); later stages use it for filter reuse and restarts."""

    model_config = ConfigDict(extra="forbid")

    family: Name | None = None
    framework: Name | None = None
    namespace: Name | None = None
    kind: Name | None = None
    name: Name | None = None


class JobEventType(StrEnum):
    STARTED = "started"
    HEARTBEAT = "heartbeat"
    EXITED = "exited"


class JobEventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: JobEventType
    node: Name | None = None
    rank: int | None = Field(default=None, ge=0)
    exit_code: int | None = Field(default=None, ge=-128, le=255)
    signal: str | int | None = None
    ts: datetime | Annotated[float, Field(ge=0, lt=1e11)] | None = None
    """RFC 3339 or epoch seconds (not milliseconds); when the launcher saw it happen."""


class JobEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    type: str
    node: str | None
    rank: int | None
    exit_code: int | None
    signal: str | None
    ts: datetime


class JobSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    family: str | None
    framework: str | None
    namespace: str | None
    kind: str | None
    name: str | None
    lines_received: int
    bytes_received: int
    created_at: datetime
    last_activity_at: datetime


class JobDetail(JobSummary):
    nodes: list[str]
    ranks: list[int]
    streams: list[StreamStatus]
    exits: list[JobEventOut]


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")
