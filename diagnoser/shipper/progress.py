"""What the shipper tells its operator: a live line on a terminal, warnings, a final summary."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.text import Text

RATE_WINDOW_S = 5.0


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@dataclass
class ShipStats:
    """Counters the upload loop keeps; `bytes_sent` includes resends after failures."""

    bytes_sent: int = 0
    lines_sent: int = 0
    lines_accepted: int = 0
    """Lines this run added to the stream, as the server counts them (see `Progress.stream`)."""
    server_offset: int | None = None
    server_lines: int | None = None
    """Lines the server holds for the stream, this run's and earlier ones."""
    lines_before: int | None = None
    """`server_lines` when this run started."""
    requests: int = 0
    retries: int = 0
    started_at: float = field(default_factory=time.monotonic)


class Progress:
    """Renders `ShipStats` as one live line (rich) when `live`, else stays quiet until `summary`.

    Rendering happens on rich's refresh thread a few times a second, from the counters alone,
    so the upload loop pays nothing per chunk beyond incrementing them.
    """

    def __init__(self, console: Console, *, live: bool) -> None:
        self.stats = ShipStats()
        self.console = console
        self._live = Live(self, console=console, refresh_per_second=4) if live else None
        self._samples: deque[tuple[float, int]] = deque()

    def __enter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.stop()

    def sent(self, chunk: bytes) -> None:
        self.stats.bytes_sent += len(chunk)
        self.stats.lines_sent += chunk.count(b"\n")

    def committed(self, offset: int) -> None:
        self.stats.server_offset = offset

    def accepted(self, lines: int, stream_lines: int | None = None) -> None:
        """An upload's receipt: `lines` more committed, and the stream's count if it says.

        The stream's count wins over the sum: an upload cut before its receipt may have its
        lines committed after the resync that read the count (late, or by another replica),
        and the next upload's receipt then leaves them out as duplicates.
        """
        stats = self.stats
        if stream_lines is not None and stats.lines_before is not None:
            stats.server_lines = stream_lines
            stats.lines_accepted = stream_lines - stats.lines_before
            return
        stats.lines_accepted += lines
        if stats.server_lines is not None:
            stats.server_lines += lines

    def stream(self, offset: int, lines: int) -> None:
        """The server's own count, read at start and after every failure.

        An upload cut by a crash or a dropped connection returns no receipt, yet the server
        committed part of it: the count is taken from the server, not summed from receipts.
        """
        stats = self.stats
        if stats.lines_before is None:
            stats.lines_before = lines
        stats.server_offset, stats.server_lines = offset, lines
        stats.lines_accepted = lines - stats.lines_before

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)

    def summary(self, where: str) -> str:
        stats = self.stats
        offset = "unknown" if stats.server_offset is None else str(stats.server_offset)
        retries = f", {stats.retries} retries" if stats.retries else ""
        held = "" if stats.server_lines is None else f", {stats.server_lines} lines in the stream"
        return (
            f"shipped to {where}: {stats.lines_accepted} lines accepted, "
            f"{human_bytes(stats.bytes_sent)} sent in {stats.requests} requests{retries}; "
            f"server offset {offset}{held}"
        )

    def lines_per_second(self, now: float) -> float:
        self._samples.append((now, self.stats.lines_sent))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        first_at, first_lines = self._samples[0]
        elapsed = now - first_at
        return (self.stats.lines_sent - first_lines) / elapsed if elapsed > 0 else 0.0

    def __rich__(self) -> Text:
        stats = self.stats
        rate = self.lines_per_second(time.monotonic())
        offset = "?" if stats.server_offset is None else f"{stats.server_offset:,}"
        return Text.assemble(
            ("shipping ", "bold"),
            f"{rate:,.0f} lines/s  {human_bytes(stats.bytes_sent)} sent  "
            f"{stats.lines_sent:,} lines  server offset {offset}",
            (f"  {stats.retries} retries" if stats.retries else "", "yellow"),
        )
