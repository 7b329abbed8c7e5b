"""POST /v1/jobs/{job_id}/logs: live log streams in, as raw bytes or as records."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from starlette.requests import ClientDisconnect

from diagnoser.api.deps import JobId, Resources, ResourcesDep
from diagnoser.api.errors import RETRY_AFTER, ApiError, OffsetGapBody, TimeoutBody, responses
from diagnoser.auth.roles import PrincipalDep
from diagnoser.ingest.records import (
    Record,
    RecordError,
    RecordTimes,
    evidence_time,
    parse_fluent_bit,
    parse_ndjson,
)
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

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499
"""A client that closed its upload mid-body, as proxies log it: not a server error (5xx)."""

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


GZIP_ENCODINGS = {"gzip", "x-gzip"}
GUNZIP_STEP_BYTES = 64 * 1024
"""Decoded bytes per decompression step: memory stays bounded whatever the ratio."""


def _gzip_encoded(request: Request) -> bool:
    """True for a gzip body, False for identity; any other encoding is refused before reading."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in GZIP_ENCODINGS:
        return True
    if encoding in {"", "identity"}:
        return False
    raise ApiError(
        415, "unsupported_media_type", f"content encoding {encoding!r}: send gzip or none"
    )


async def _gunzipped(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """A gzip body decoded as it arrives, in bounded steps, and never past `limit` decoded
    bytes (413): a small zip bomb costs neither memory nor framing. Members may follow one
    another (`cat a.gz b.gz`); a body cut inside a member is refused (422)."""
    too_large = ApiError(
        413, "payload_too_large", f"a gzip body may decode to at most {limit} bytes"
    )
    gunzip = zlib.decompressobj(wbits=31)
    decoded = received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            pending = chunk
            while pending:
                if gunzip.eof:
                    gunzip = zlib.decompressobj(wbits=31)
                piece = gunzip.decompress(pending, GUNZIP_STEP_BYTES)
                decoded += len(piece)
                if decoded > limit:
                    raise too_large
                if piece:
                    yield piece
                pending = gunzip.unused_data if gunzip.eof else gunzip.unconsumed_tail
    except zlib.error as exc:
        raise ApiError(422, "invalid_request", f"gzip body: {exc}") from exc
    if received and not gunzip.eof:
        raise ApiError(422, "invalid_request", "gzip body: it ends inside a compressed member")


async def _read_capped(request: Request, limit: int) -> bytes:
    """The whole record body, gunzipped when sent so (Fluent Bit's `compress gzip`), capped."""
    too_large = ApiError(413, "payload_too_large", f"record bodies are limited to {limit} bytes")
    gzip = _gzip_encoded(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large  # compressed this large, it decodes to at least about as much
    body = bytearray()
    chunks = _gunzipped(request.stream(), limit) if gzip else request.stream()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _records_as_bytes(records: list[Record], received: float) -> tuple[bytes, RecordTimes | None]:
    """The records as stream bytes, and their times where sane (else the lines get the
    receive time, as raw lines do)."""
    parts = [record.line.encode("utf-8", "surrogatepass") + b"\n" for record in records]
    times = [evidence_time(record.ts, received) for record in records]
    return b"".join(parts), RecordTimes.of([len(part) for part in parts], times)


@router.post(
    "/logs",
    response_model=IngestResult,
    responses={
        **responses(413, 415, 422),
        408: {"model": TimeoutBody, "description": "the body stopped arriving; rest committed"},
        409: {"model": OffsetGapBody, "description": "offset beyond the committed one"},
        429: {**responses(429)[429], "headers": RETRY_AFTER},
        503: {**responses(503)[503], "headers": RETRY_AFTER},
    },
    openapi_extra={"requestBody": LOG_BODIES},
)
async def post_logs(
    job_id: JobId,
    request: Request,
    resources: ResourcesDep,
    principal: PrincipalDep,
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
    warnings: list[str] = []
    try:
        metadata = _metadata_from_headers(request)
        # Before a new job's first batch reaches the compression stage: its family (the
        # header's, else from its name) is loaded with the stored filters and what earlier
        # jobs taught is promoted, so the job is compressed from its first line (as after
        # `PUT /v1/jobs/{id}`). Nothing to do once the job is being compressed.
        await resources.filters.prepare(job_id, metadata.get("family"))
        attested = principal.binding.node is not None  # node, job and stream checked already
        key = StreamKey(job_id, stream or default_stream_id(node, rank), node, rank, attested)
        if media_type in RAW_TYPES:
            chunks: AsyncIterator[bytes] = request.stream()
            if _gzip_encoded(request):
                # Offsets count decoded bytes: the stream is the log, however it travelled.
                chunks = _gunzipped(chunks, resources.settings.ingest.max_json_body_bytes)
            outcome = await _write(resources, key, chunks, offset, metadata)
            empty = outcome.received_bytes == 0
        else:
            body = await _read_capped(request, resources.settings.ingest.max_json_body_bytes)
            parse = parse_ndjson if media_type in NDJSON_TYPES else parse_fluent_bit
            try:
                records = parse(body)
            except RecordError as exc:
                raise ApiError(422, "invalid_request", str(exc)) from exc
            named = next((r.node for r in records if principal.binding.node_problem(r.node)), None)
            if named is not None:
                raise ApiError(403, "forbidden", str(principal.binding.node_problem(named)))
            outcome = await _write_records(resources, key, records, offset, metadata)
            empty = not records
    except ClientDisconnect:
        # A shipper killed or timed out on its side: every whole line that arrived is
        # committed (the writer saw to it), and the client resumes from the committed offset.
        log.info("job %r stream %r: the client closed the upload mid-body", job_id, node)
        raise ApiError(
            CLIENT_CLOSED, "client_closed_request", "the client closed the request mid-body"
        ) from None
    finally:
        resources.admission.leave()
    if empty:
        # `curl --data-binary @missing.log` sends nothing and would otherwise look like success.
        warnings.append("empty body: no lines received")
    return IngestResult(
        job_id=job_id,
        stream=key.stream,
        lines_accepted=outcome.lines_accepted,
        duplicate_bytes=outcome.duplicate_bytes,
        truncated_lines=outcome.truncated_lines,
        next_offset=outcome.next_offset,
        stream_lines=outcome.stream_lines,
        diagnoses=outcome.diagnoses,
        warnings=warnings,
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
    received = time.time()
    own, own_times = _records_as_bytes(groups.pop((key.node, key.rank), []), received)
    outcome = await _write(resources, key, _one(own), offset, metadata, own_times)
    for (node, rank), group in groups.items():
        other = StreamKey(key.job_id, default_stream_id(node, rank), node, rank, key.attested)
        body, times = _records_as_bytes(group, received)
        extra = await _write(resources, other, _one(body), None, metadata, times)
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
    times: RecordTimes | None = None,
) -> WriteOutcome:
    try:
        return await resources.writer.write(
            key, chunks, offset=offset, job_metadata=metadata, times=times
        )
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
