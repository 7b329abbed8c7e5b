"""Framing: turn a byte stream, arriving in arbitrary chunks, into clean text lines.

The work is done per chunk, not per line: one split, one decode and, only when the chunk holds
such bytes, one carriage-return, NUL and ANSI pass each. Per-line Python runs only for a line
over the length limit or for a chunk that can carry launcher or CRI prefixes (`prefixes`).

What a line's text is: the bytes between two ``\\n``, without a ``\\r`` right before the ``\\n``,
decoded as UTF-8 with U+FFFD for invalid bytes, NUL bytes and ANSI escape sequences removed;
past the limit (counted in raw bytes) it is cut and ends with ``…[truncated N bytes]``. A
lone ``\\r`` (a progress bar redrawing itself) stays in the text. Launcher prefixes stay too;
the CRI header is removed (see `prefixes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import accumulate
from operator import add

from diagnoser.ingest.prefixes import (
    CriRecords,
    LauncherPrefixes,
    find_prefix,
    line_heads,
    line_starts,
    may_have_prefix,
)

DEFAULT_MAX_LINE_BYTES = 64 * 1024

# CSI (colours, cursor moves), OSC (window titles, hyperlinks) and two-byte escapes. Nothing
# here can match "\n", so one pass over a whole chunk never joins lines; a sequence cut short
# by the end of its line, or by truncation, is removed as far as it goes.
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[ -/]*[0-~]?)")


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
    """Per-line rank parsed from a launcher prefix; None when no line carried one.

    The global rank: torchrun's ``[rankN]:``, else an ``srun --label`` task id on a line with
    no torchelastic role prefix (see `prefixes.LauncherPrefixes`)."""
    local_ranks: list[int | None] | None = None
    """Per-line local rank from a torchelastic ``[{role}{local_rank}]:`` prefix, or None."""
    tasks: list[int | None] | None = None
    """Per-line Slurm task id from an ``srun --label`` prefix, or None."""
    ts: list[int | None] | None = None
    """Per-line log time in Unix epoch nanoseconds, from a CRI header or from the record that
    carried the line (`records.RecordTimes`); None when no line had one."""
    truncated: int = 0
    """How many of these lines were cut at the length limit."""

    def start_of(self, index: int) -> int:
        """Stream byte offset where line `index` starts."""
        return self.stream_offset if index == 0 else self.ends[index - 1]


def _marker(dropped: int) -> str:
    return f" …[truncated {dropped} bytes]"


def _cut(content: bytes, limit: int) -> int:
    """Where to cut `content` (longer than `limit`): at `limit`, moved back off a split
    UTF-8 character so the kept part does not end in a replacement character."""
    cut = limit
    for _ in range(3):
        if cut and content[cut] & 0xC0 == 0x80:
            cut -= 1
        else:
            break
    return cut


def _scrub(data: bytes) -> bytes:
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")
    if b"\x1b" in data:
        data = _ANSI.sub(b"", data)
    return data


class Framer:
    """Frames one (job, stream) byte stream, fed in arbitrary chunks.

    `ends` count raw stream bytes (terminators, stripped escapes and CRI headers included), so
    ``offset`` is always an exact resume point. A partial last line is held until its ``\\n``
    arrives or `close` is called; past the limit only its first ``limit + 1`` bytes are kept
    and the rest counted, so memory stays bounded whatever the client sends.
    """

    __slots__ = (
        "_closed",
        "_cri",
        "_dropped",
        "_held",
        "_last_cr",
        "_launcher",
        "_limit",
        "_line_no",
        "_offset",
        "_raw",
        "truncated_lines",
    )

    def __init__(
        self,
        stream_offset: int = 0,
        line_no: int = 1,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        if stream_offset < 0 or line_no < 1 or max_line_bytes < 1:
            raise ValueError("need stream_offset >= 0, line_no >= 1, max_line_bytes >= 1")
        self._offset = stream_offset
        self._raw = stream_offset
        self._line_no = line_no
        self._limit = max_line_bytes
        self._held = bytearray()
        self._dropped = 0
        self._last_cr = False
        self._closed = False
        self._cri = CriRecords(max_line_bytes)
        self._launcher = LauncherPrefixes()
        self.truncated_lines = 0
        """Lines cut at the length limit over this framer's life."""

    @property
    def offset(self) -> int:
        """Stream offset just past the last line handed out: where a resend should start."""
        return self._offset

    @property
    def line_no(self) -> int:
        """Number the next line handed out will get."""
        return self._line_no

    @property
    def pending_bytes(self) -> int:
        """Raw bytes received but not yet in a line (partial line, waiting CRI records)."""
        return self._raw + len(self._held) + self._dropped - self._offset

    def feed(self, chunk: bytes) -> LineBatch:
        """Frame the complete lines that `chunk` finishes; hold back a partial last line."""
        if self._closed:
            raise ValueError("feed() on a closed Framer")
        last = chunk.rfind(b"\n")
        if last < 0:
            self._hold(chunk)
            return self._finish("", [], [], 0, closing=False)
        if self._dropped:
            first = chunk.find(b"\n")
            line, end = self._finish_overflow(chunk[:first], terminated=True)
            text, lines, ends, truncated = self._frame(chunk[first + 1 : last + 1])
            lines.insert(0, line)
            ends.insert(0, end)
            text, truncated = None, truncated + 1
        else:
            if self._held:
                body = b"".join((self._held, memoryview(chunk)[: last + 1]))
                self._held = bytearray()
            else:
                body = chunk[: last + 1]
            text, lines, ends, truncated = self._frame(body)
        self._hold(chunk[last + 1 :])
        return self._finish(text, lines, ends, truncated, closing=False)

    def close(self) -> LineBatch:
        """Flush the held partial line and any waiting CRI partial records; idempotent.

        A trailing ``\\r`` of the unterminated last line is dropped like one before ``\\n``.
        """
        if self._closed:
            return self._finish("", [], [], 0, closing=False)
        self._closed = True
        text: str | None
        if self._dropped:
            line, end = self._finish_overflow(b"", terminated=False)
            text, lines, ends, truncated = None, [line], [end], 1
        elif self._held:
            body = bytes(self._held) + b"\n"
            self._held = bytearray()
            text, lines, ends, truncated = self._frame(body)
            # The "\n" added above is not in the stream.
            ends[-1] -= 1
            self._raw -= 1
        else:
            text, lines, ends, truncated = "", [], [], 0
        return self._finish(text, lines, ends, truncated, closing=True)

    def _hold(self, tail: bytes) -> None:
        """Keep `tail` as (part of) the partial last line, bounded at ``limit + 1`` bytes."""
        if not tail:
            return
        room = self._limit + 1 - len(self._held)
        if self._dropped or len(tail) > room:
            # One byte past the limit is kept so the cut can see whether it splits a character.
            self._held += tail[:room]
            self._dropped += len(tail) - max(room, 0)
            self._last_cr = tail[-1] == 0x0D
        else:
            self._held += tail

    def _frame(self, body: bytes) -> tuple[str | None, list[str], list[int], int]:
        """Frame whole lines: `body` is empty or ends with ``\\n``.

        Returns the text (the lines joined, each followed by ``\\n``; None if it has to be
        rebuilt), the lines, their ends and how many were truncated.
        """
        base = self._raw
        self._raw += len(body)
        if not body:
            return "", [], [], 0
        # No line can exceed the limit unless the body does (+1 for one "\n").
        may_be_long = len(body) > self._limit + 1
        if body.isascii() and b"\r" not in body and b"\x00" not in body and b"\x1b" not in body:
            # Text and raw bytes agree one to one: line lengths come from the str lines.
            text = body.decode("ascii")
            lines = text.split("\n")
            lines.pop()
            lens = list(map(len, lines))
            if may_be_long and max(lens) > self._limit:
                return self._frame_long(body, base)
        else:
            parts = body.split(b"\n")
            parts.pop()
            lens = list(map(len, parts))
            if may_be_long and max(lens) > self._limit:
                return self._frame_long(body, base)
            if b"\r" in body:
                body = body.replace(b"\r\n", b"\n")
            text = _scrub(body).decode("utf-8", "replace")
            lines = text.split("\n")
            lines.pop()
        ends = list(map(add, accumulate(lens), range(base + 1, base + 1 + len(lens))))
        return text, lines, ends, 0

    def _frame_long(self, body: bytes, base: int) -> tuple[str | None, list[str], list[int], int]:
        """The rare path: per-line work to cut lines over the limit."""
        parts = body.split(b"\n")
        parts.pop()
        lens = list(map(len, parts))
        ends = list(map(add, accumulate(lens), range(base + 1, base + 1 + len(lens))))
        limit = self._limit
        cuts: list[tuple[int, int]] = []
        for index, part in enumerate(parts):
            content = part[:-1] if part.endswith(b"\r") else part
            if len(content) > limit:
                cut = _cut(content, limit)
                cuts.append((index, len(content) - cut))
                content = content[:cut]
            parts[index] = content
        parts.append(b"")
        lines = _scrub(b"\n".join(parts)).decode("utf-8", "replace").split("\n")
        lines.pop()
        return None, lines, ends, self._mark(lines, cuts)

    def _finish_overflow(self, rest: bytes, *, terminated: bool) -> tuple[str, int]:
        """Complete the held over-long line with `rest`; return its text and end."""
        size = len(self._held) + self._dropped + len(rest)
        ends_in_cr = rest[-1] == 0x0D if rest else self._last_cr
        content = bytes(self._held)
        cut = _cut(content, self._limit)
        dropped = size - ends_in_cr - cut
        line = _scrub(content[:cut]).decode("utf-8", "replace") + _marker(dropped)
        self._raw += size + terminated
        self._held = bytearray()
        self._dropped = 0
        self._last_cr = False
        return line, self._raw

    @staticmethod
    def _mark(lines: list[str], cuts: list[tuple[int, int]]) -> int:
        """Append the truncation marker to each cut line; return how many there were."""
        for index, dropped in cuts:
            lines[index] += _marker(dropped)
        return len(cuts)

    def _finish(
        self,
        text: str | None,
        lines: list[str],
        ends: list[int],
        truncated: int,
        *,
        closing: bool,
    ) -> LineBatch:
        """Apply CRI and launcher prefixes, then hand the lines out and advance the counters.

        `text` is the lines joined, each followed by "\\n", or None (built if needed).
        """
        ts: list[int | None] | None = None
        heads = None
        if may_have_prefix(line_starts(lines)):
            if text is None:
                text = _text_of(lines)
            if find_prefix(text):
                heads = line_heads(lines)
                cri = self._cri.strip(text, lines, ends) if CriRecords.may_contain(heads) else None
                if cri is not None:
                    lines, ends, ts = cri.lines, cri.ends, cri.ts
                    truncated += self._mark(lines, cri.truncated)
                    heads = line_heads(lines)
        if closing:
            rest = self._cri.flush(self._raw)
            if rest.lines:
                truncated += self._mark(rest.lines, rest.truncated)
                ts = (ts or [None] * len(lines)) + rest.ts
                lines = lines + rest.lines
                ends = ends + rest.ends
                heads = line_heads(lines)
        launcher = self._launcher.parse(heads) if heads is not None else None
        ranks = local_ranks = tasks = None
        if launcher is not None:
            ranks, local_ranks, tasks = launcher.ranks, launcher.local_ranks, launcher.tasks
        batch = LineBatch(
            self._offset,
            self._line_no,
            lines,
            ends,
            ranks,
            local_ranks=local_ranks,
            tasks=tasks,
            ts=ts,
            truncated=truncated,
        )
        if ends:
            self._offset = ends[-1]
        self._line_no += len(lines)
        self.truncated_lines += truncated
        return batch


def _text_of(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def frame(
    data: bytes,
    stream_offset: int = 0,
    line_no: int = 1,
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> LineBatch:
    """Frame a complete stream (a file, a test sample) in one call: `feed` then `close`."""
    framer = Framer(stream_offset, line_no, max_line_bytes=max_line_bytes)
    head = framer.feed(data)
    tail = framer.close()
    if not tail.lines:
        return head
    return LineBatch(
        head.stream_offset,
        head.first_line_no,
        head.lines + tail.lines,
        head.ends + tail.ends,
        _joined(head.ranks, tail.ranks, head, tail),
        local_ranks=_joined(head.local_ranks, tail.local_ranks, head, tail),
        tasks=_joined(head.tasks, tail.tasks, head, tail),
        ts=_joined(head.ts, tail.ts, head, tail),
        truncated=head.truncated + tail.truncated,
    )


def _joined(
    a: list[int | None] | None, b: list[int | None] | None, head: LineBatch, tail: LineBatch
) -> list[int | None] | None:
    if a is None and b is None:
        return None
    return (a or [None] * len(head.lines)) + (b or [None] * len(tail.lines))
