"""POST /v1/jobs/{job_id}/logs: live log streams in, as raw bytes or as records."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from diagnoser.api.deps import JobId, Resources, ResourcesDep
from diagnoser.api.errors import RETRY_AFTER, ApiError, OffsetGapBody, TimeoutBody, responses
from diagnoser.ingest.records import Record, RecordError, parse_fluent_bit, parse_ndjson
from diagnoser.ingest.schemas import (
    MAX_NAME_LENGTH,
    MAX_RANK,
    MAX_STREAM_LENGTH,
    NAME_PATTERN,
    RECORD_SCHEMA,
    STREAM_PATTERN,
    IngestResult,
    JobMetadata,
    StreamStatus,
)
from diagnoser.ingest.streams import JOB_METADATA_FIELDS, default_stream_id
from diagnoser.ingest.writer import (
    IdleTimeoutError,
    OffsetGapError,
    StreamBusyError,
    WriteOutcome,
)
from diagnoser.pipeline import StreamKey
from diagnoser.store.models import LogStreamRow

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["ingest"])
NodeQuery = Annotated[str, Query(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
RankQuery = Annotated[int | None, Query(ge=0, le=MAX_RANK)]
StreamQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_STREAM_LENGTH,
        pattern=STREAM_PATTERN,
        description="Defaults to `node` or `node/rank`.",
    ),
]
MAX_OFFSET = 2**63 - 1
LOG_BODIES = {
    "required": False,
    "content": {
        "text/plain": {
            "schema": {"type": "string", "description": "Raw log bytes (any encoding)."}
        },
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/x-ndjson": {
            "schema": {
                "type": "array",
                "items": RECORD_SCHEMA,
                "description": "One JSON record per line (also application/ndjson, jsonl).",
            }
        },
        "application/json": {
            "schema": {
                "description": "Fluent Bit's `http` output, `format json`.",
                "anyOf": [{"type": "array", "items": RECORD_SCHEMA}, RECORD_SCHEMA],
            }
        },
    },
}
"""What the upload route reads itself (FastAPI sees no body parameter)."""

RAW_TYPES = {"", "text/plain", "application/octet-stream"}
NDJSON_TYPES = {"application/x-ndjson", "application/ndjson", "application/jsonl"}
JSON_TYPES = {"application/json"}
HEADER_PREFIX = "x-diagnoser-job-"


def _metadata_from_headers(request: Request) -> dict[str, str]:
    """`X-Diagnoser-Job-Family: llama-70b` and friends, validated like the PUT body."""
    raw = {
        field: value
        for field in JOB_METADATA_FIELDS
        if (value := request.headers.get(HEADER_PREFIX + field))
    }
    try:
        parsed = JobMetadata.model_validate(raw)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"job metadata headers: {exc}") from exc
    return parsed.model_dump(exclude_none=True)


async def _read_capped(request: Request, limit: int) -> bytes:
    """The whole record body, gunzipped when sent so (Fluent Bit's `compress gzip`), capped."""
    too_large = ApiError(413, "payload_too_large", f"record bodies are limited to {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in {"identity", "gzip"}:
        raise ApiError(415, "unsupported_media_type", f"content encoding {encoding!r}: use gzip")
    gunzip = zlib.decompressobj(wbits=31) if encoding == "gzip" else None
    body = bytearray()
    try:
        async for chunk in request.stream():
            # Bounded output per step, so a small zip bomb cannot allocate past the cap.
            body += gunzip.decompress(chunk, limit + 1 - len(body)) if gunzip else chunk
            if len(body) > limit or (gunzip is not None and gunzip.unconsumed_tail):
                raise too_large
    except zlib.error as exc:
        raise ApiError(422, "invalid_request", f"gzip body: {exc}") from exc
    return bytes(body)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _records_as_bytes(records: list[Record]) -> bytes:
    return b"".join(record.line.encode("utf-8", "surrogatepass") + b"\n" for record in records)


@router.post(
    "/logs",
    response_model=IngestResult,
    responses={
        **responses(413, 415, 422),
        408: {"model": TimeoutBody, "description": "the body stopped arriving; rest committed"},
        409: {"model": OffsetGapBody, "description": "offset beyond the committed one"},
        429: {**responses(429)[429], "headers": RETRY_AFTER},
    },
    openapi_extra={"requestBody": LOG_BODIES},
)
async def post_logs(
    job_id: JobId,
    request: Request,
    resources: ResourcesDep,
    node: NodeQuery,
    rank: RankQuery = None,
    stream: StreamQuery = None,
    offset: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
) -> IngestResult:
    """Append log bytes to a stream.

    `text/plain` bodies are raw bytes, processed as they arrive (chunked uploads may stay open
    for hours); `offset` makes a retry safe. `application/x-ndjson` carries one
    `{"line", "ts", "node", "rank"}` object per line; `application/json` is Fluent Bit's `http`
    output (`format json`).
    """
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in RAW_TYPES | NDJSON_TYPES | JSON_TYPES:
        hint = " (curl: add -H 'Content-Type: text/plain')" if "form" in media_type else ""
        raise ApiError(
            415,
            "unsupported_media_type",
            f"content type {media_type!r} is not accepted: send text/plain, "
            f"application/x-ndjson or application/json{hint}",
        )
    if not resources.admission.try_enter():
        raise ApiError(
            429,
            "too_many_requests",
            "too many ingest requests in flight",
            headers={"Retry-After": "1"},
        )
    try:
        metadata = _metadata_from_headers(request)
        key = StreamKey(job_id, stream or default_stream_id(node, rank), node, rank)
        if media_type in RAW_TYPES:
            outcome = await _write(resources, key, request.stream(), offset, metadata)
        else:
            body = await _read_capped(request, resources.settings.ingest.max_json_body_bytes)
            parse = parse_ndjson if media_type in NDJSON_TYPES else parse_fluent_bit
            try:
                records = parse(body)
            except RecordError as exc:
                raise ApiError(422, "invalid_request", str(exc)) from exc
            outcome = await _write_records(resources, key, records, offset, metadata)
    finally:
        resources.admission.leave()
    return IngestResult(
        job_id=job_id,
        stream=key.stream,
        lines_accepted=outcome.lines_accepted,
        duplicate_bytes=outcome.duplicate_bytes,
        truncated_lines=outcome.truncated_lines,
        next_offset=outcome.next_offset,
        diagnoses=outcome.diagnoses,
    )


async def _write_records(
    resources: Resources,
    key: StreamKey,
    records: list[Record],
    offset: int | None,
    metadata: dict[str, str],
) -> WriteOutcome:
    """Records that name another node or rank go to that node's stream, appended."""
    groups: dict[tuple[str, int | None], list[Record]] = {}
    for record in records:
        node = record.node or key.node
        rank = record.rank if record.rank is not None else key.rank
        groups.setdefault((node, rank), []).append(record)
    own = groups.pop((key.node, key.rank), [])
    outcome = await _write(resources, key, _one(_records_as_bytes(own)), offset, metadata)
    for (node, rank), group in groups.items():
        other = StreamKey(key.job_id, default_stream_id(node, rank), node, rank)
        extra = await _write(resources, other, _one(_records_as_bytes(group)), None, metadata)
        outcome.lines_accepted += extra.lines_accepted
        outcome.truncated_lines += extra.truncated_lines
        outcome.diagnoses.extend(d for d in extra.diagnoses if d not in outcome.diagnoses)
    return outcome


async def _write(
    resources: Resources,
    key: StreamKey,
    chunks: AsyncIterator[bytes],
    offset: int | None,
    metadata: dict[str, str],
) -> WriteOutcome:
    try:
        return await resources.writer.write(key, chunks, offset=offset, job_metadata=metadata)
    except OffsetGapError as exc:
        raise ApiError(
            409,
            "offset_gap",
            f"offset {offset} is beyond the committed offset {exc.expected}: resend from there",
            expected_offset=exc.expected,
        ) from exc
    except StreamBusyError as exc:
        raise ApiError(
            429, "stream_busy", f"stream {key.stream!r}: {exc}", headers={"Retry-After": "1"}
        ) from exc
    except IdleTimeoutError as exc:
        raise ApiError(
            408,
            "request_timeout",
            f"no bytes for {resources.settings.ingest.idle_timeout_s:g}s; committed up to "
            f"{exc.outcome.next_offset}",
            next_offset=exc.outcome.next_offset,
        ) from exc


@router.get(
    "/logs",
    response_model=StreamStatus,
    responses=responses(404, described={404: "no such stream"}),
)
async def get_stream(
    job_id: JobId,
    resources: ResourcesDep,
    node: NodeQuery,
    rank: RankQuery = None,
    stream: StreamQuery = None,
) -> LogStreamRow:
    """A stream's committed offset: where a shipper resumes after a restart."""
    stream_id = stream or default_stream_id(node, rank)
    async with resources.sessions() as session:
        row = await session.scalar(
            select(LogStreamRow).where(
                LogStreamRow.job_id == job_id, LogStreamRow.stream == stream_id
            )
        )
    if row is None:
        raise ApiError(404, "not_found", f"job {job_id!r} has no stream {stream_id!r}")
    return row
