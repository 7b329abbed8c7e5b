"""The server's replies, as the shipper reads them (only the fields it relies on)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StreamState(_Reply):
    """GET /v1/jobs/{job}/logs: where the server's copy of the stream ends."""

    committed_offset: int
    lines: int = 0
    stream: str | None = None


class UploadReceipt(_Reply):
    """200 to a POST: the server's committed offset after this upload."""

    next_offset: int
    lines_accepted: int = 0
    duplicate_bytes: int = 0
    stream_lines: int | None = None
    """The stream's own count up to `next_offset` (None: a server too old to send it)."""


class ErrorReply(_Reply):
    """Any error: `{"error": code, "detail": message}`, plus `expected_offset` on offset_gap."""

    error: str = ""
    detail: str = ""
    expected_offset: int | None = None
