"""Framing: turn a byte stream, arriving in arbitrary chunks, into clean text lines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LineBatch:
    """The lines framed from one chunk of one stream, in order.

    Parallel lists instead of one object per line keep the hot path free of per-line
    allocations; consumers index them together.
    """

    stream_offset: int
    """Byte offset, within the stream, where the first line starts."""
    first_line_no: int
    """1-based number of the first line within the stream."""
    lines: list[str]
    """Decoded, cleaned text of each line, without its terminator."""
    ends: list[int]
    """Stream byte offset just past each line's terminator (the next line's start)."""
    ranks: list[int | None] | None = None
    """Per-line rank parsed from a launcher prefix; None when no line carried one."""

    def start_of(self, index: int) -> int:
        """Stream byte offset where line `index` starts."""
        return self.stream_offset if index == 0 else self.ends[index - 1]
