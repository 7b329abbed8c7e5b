"""Standard input (or any pipe) as a stream source: kept in memory until the server commits it.

A pipe cannot be re-read, so the bytes handed out stay buffered until `release` says the server
has committed them; a resend after a failure is served from that buffer. The buffer is bounded
by how far the server's committed offset trails what was sent (about one request); while the
server is unreachable nothing more is read, so the writer of the pipe is held back (the pipe
fills) rather than this process growing without bound.

The pipe's first byte takes the server's committed offset: a pipe has no earlier content to
match against the stream, so whatever comes in continues it.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable

from diagnoser.shipper.follow import CHUNK_BYTES, whole_lines


def _notify_nothing(message: str) -> None:
    del message


class PipeReader:
    """Non-blocking reader of a pipe's file descriptor, with the same interface as FileFollower."""

    def __init__(
        self,
        fd: int,
        *,
        notify: Callable[[str], None] = _notify_nothing,
    ) -> None:
        self._fd = fd
        self._notify = notify
        self._buffer = bytearray()
        self._base = 0
        self._cursor = 0
        self._closed = False

    @property
    def offset(self) -> int:
        return self._base + self._cursor

    @property
    def exhausted(self) -> bool:
        return self._closed and self._cursor == len(self._buffer)

    def start(self, committed: int) -> None:
        self._base = committed

    def read(self, size: int = CHUNK_BYTES) -> bytes:
        """Whole lines while the pipe is open; at its end, the rest (a partial last line too)."""
        if len(self._buffer) - self._cursor < size and not self._closed:
            self._fill(size)
        data = bytes(self._buffer[self._cursor : self._cursor + size])
        if data and not self._closed:
            data = whole_lines(data, size)
        self._cursor += len(data)
        return data

    def seek(self, offset: int) -> None:
        if self._base <= offset <= self._base + len(self._buffer):
            self._cursor = offset - self._base
            return
        if offset > self._base:
            self._buffer.clear()  # the server already has all of it, and more
        else:
            # The server lost bytes it had committed: what is still buffered continues there.
            self._notify(f"{self._base - offset} bytes no longer buffered are lost")
        self._base, self._cursor = offset, 0

    def release(self, committed: int) -> None:
        done = min(committed - self._base, self._cursor)
        if done > 0:
            del self._buffer[:done]
            self._base += done
            self._cursor -= done

    def close(self) -> None:
        self._buffer.clear()

    def _fill(self, size: int) -> None:
        """Take what the pipe has ready, up to `size` past the cursor, noticing its end."""
        while len(self._buffer) - self._cursor < size:
            ready, _, _ = select.select([self._fd], [], [], 0)
            if not ready:
                return
            data = os.read(self._fd, max(size, CHUNK_BYTES))
            if not data:
                self._closed = True
                return
            self._buffer += data
