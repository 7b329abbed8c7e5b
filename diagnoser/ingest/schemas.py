"""The ingest API's contracts: what clients send and what they get back."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]*$"
"""Job ids and node names: what Kubernetes and schedulers use, ASCII, nothing to escape."""
MAX_NAME_LENGTH = 253
"""A DNS name; the width of every id column."""
STREAM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]*(/[A-Za-z0-9][A-Za-z0-9_.:@-]*)*$"
"""Stream ids: names joined by `/` (`node/rank` by default); no empty, dot-led or `..` part."""
MAX_STREAM_LENGTH = 512
MAX_RANK = 9_999_999
"""Ranks are small integers (at most 7 digits, so text ranks can be bounded by a pattern too)."""
MAX_SIGNAL_LENGTH = 32

Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9][\w.:@/-]*$")
]
NodeName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]


def _json_number(value: object) -> object:
    """A JSON number, not `true` or `"3"`, which pydantic's lax mode would take for integers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a JSON number")
    return value


JSON_NUMBER = BeforeValidator(_json_number)
"""With `int`: an integer as JSON Schema means it, `3` or `3.0`, never `true` or `"3"`.

Constraints go before it in `Annotated`, or the JSON schema loses `minimum`/`maximum`."""
Rank = Annotated[int, Field(ge=0, le=MAX_RANK), JSON_NUMBER]

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})?"
)


def _date_time_text(value: object) -> object:
    """An RFC 3339 date and time; no epoch numbers or bare dates, which pydantic would accept."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and _RFC3339.fullmatch(value):
        return value
    raise ValueError("expected an RFC 3339 date-time such as 2024-05-01T12:00:00Z")


def _as_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except OverflowError as exc:  # year 1 east of UTC, or year 9999 west of it
        raise ValueError("date-time out of range") from exc


DateTimeText = Annotated[datetime, BeforeValidator(_date_time_text), AfterValidator(_as_utc)]
"""A time given as RFC 3339 text; one without a zone is UTC."""


def _as_seconds(value: float) -> float:
    return value / 1000 if value >= MILLISECONDS_FROM else value


MILLISECONDS_FROM = 2e10
"""Epoch numbers from here on are milliseconds (2e10 s is the year 2603), as pydantic reads them."""
EpochTime = Annotated[float, Field(ge=0, lt=1e14, strict=True), AfterValidator(_as_seconds)]
"""Seconds, or milliseconds, since the epoch; always seconds once validated."""


class IngestResult(BaseModel):
    job_id: str
    stream: str
    lines_accepted: int
    duplicate_bytes: int = Field(description="Bytes already committed by an earlier request.")
    truncated_lines: int = Field(description="Lines cut at the length limit.")
    next_offset: int = Field(description="Committed offset: where this stream's next byte goes.")
    stream_lines: int = Field(
        description="Lines the stream holds up to next_offset: the server's count, whatever "
        "earlier uploads whose receipts the client never got committed."
    )
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
    framework: Annotated[Name, Field(max_length=64)] | None = None
    namespace: Name | None = None
    kind: Annotated[Name, Field(max_length=64)] | None = None
    name: Name | None = None


class JobEventType(StrEnum):
    STARTED = "started"
    HEARTBEAT = "heartbeat"
    EXITED = "exited"


class JobEventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: JobEventType
    node: NodeName | None = None
    rank: Rank | None = None
    exit_code: Annotated[int, Field(ge=-128, le=255), JSON_NUMBER] | None = None
    signal: (
        Annotated[
            str, Field(min_length=1, max_length=MAX_SIGNAL_LENGTH, pattern=r"^[A-Za-z0-9+-]+$")
        ]
        | Annotated[int, Field(ge=1, le=255), JSON_NUMBER]
        | None
    ) = None
    """A name (`SIGKILL`, `kill`) or a number (9)."""
    ts: DateTimeText | EpochTime | None = None
    """RFC 3339, or epoch seconds or milliseconds; when the launcher saw it happen."""


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


class CompressionCounts(BaseModel):
    """What compression did to a job's lines, added up over every replica (database)."""

    lines_in: int
    lines_kept: int
    lines_filtered: int
    ratio: float = Field(description="lines_kept / lines_in; 0 for no lines.")


class JobDetail(JobSummary):
    nodes: list[str]
    ranks: list[int]
    streams: list[StreamStatus]
    exits: list[JobEventOut]
    compression: CompressionCounts | None = Field(
        default=None, description="None when no replica has compressed the job."
    )


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


_NODE_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME_LENGTH,
    "pattern": NAME_PATTERN,
}
RECORD_SCHEMA: dict[str, object] = {
    "type": "object",
    "description": (
        "One log line. The text is `line` (ours), `log` (Fluent Bit) or `message` (Vector); "
        "the time `ts`, `date`, `timestamp` or `time` (RFC 3339 or epoch seconds). "
        "Other keys are ignored."
    ),
    "properties": {
        "line": {"type": "string"},
        "log": {"type": "string"},
        "message": {"type": "string"},
        "node": {
            "anyOf": [_NODE_SCHEMA, {"type": "null"}],
            "description": "Another node's line: goes to its stream.",
        },
        "rank": {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_RANK},
                {"type": "string", "pattern": r"^[0-9]{1,7}$"},
                {"type": "null"},
            ]
        },
        "kubernetes": {
            "type": ["object", "null"],
            "description": "Fluent Bit's kubernetes filter; `host` is the node without `node`.",
            "properties": {"host": {"anyOf": [_NODE_SCHEMA, {"type": "null"}]}},
        },
    },
    "anyOf": [{"required": ["line"]}, {"required": ["log"]}, {"required": ["message"]}],
}
"""A record of an NDJSON or JSON log body, as OpenAPI describes it (records.py reads it)."""
