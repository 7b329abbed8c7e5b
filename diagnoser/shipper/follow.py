"""Follow a log file like `tail -F`, as one byte stream whose offset only grows.

The server knows a stream by byte offsets, not by files, so the follower maps files onto the
stream: each file the path has named is a *segment* whose position 0 is stream offset `base`.

- Rotation (the path now names another inode): the old file is read to its end as it is at
  that moment, then the new file follows from position 0; its base is where the old one ended.
- Truncation (the file is now shorter than the read position): reading goes on from position
  0 of the same file; its base moves to where the old content ended, so offsets still grow.
- Start at the server's committed offset `c`. Assumption, since the server cannot tell which
  file its bytes came from: if the file holds at least `c` bytes it is the same file the
  stream was shipped from, and reading resumes at position `c` (base 0); if it is shorter it
  was rotated or truncated since, and the whole file is new: position 0, base `c`. (A file
  rotated and then regrown past `c` before the shipper restarts is indistinguishable from the
  original and loses its first `c` bytes; keep restarts short or ship each rotated file.)
- Resending after a failure seeks back to the committed offset. Files rotated away stay open
  until the server has committed them, so their bytes can be resent; bytes that are truly
  gone (truncated before being committed) are skipped, and the next bytes take their offset.

While following, only whole lines are handed out (the server commits whole lines only, so a
partial line would be resent anyway), except the tail of a file rotated away and a line longer
than a whole read. Without `follow` the file is read once to its end, partial last line
included. Pure file I/O: no HTTP here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 64 * 1024


def whole_lines(data: bytes, size: int) -> bytes:
    """`data` up to its last newline; all of it if it fills a read of `size` with no newline."""
    if data.endswith(b"\n"):
        return data
    cut = data.rfind(b"\n") + 1
    if cut:
        return data[:cut]
    return data if len(data) >= size else b""


class NotARegularFileError(OSError):
    """The path names a pipe, device or directory: it cannot be re-read from an offset."""


@dataclass
class _Segment:
    fd: int
    base: int
    identity: tuple[int, int]
    end: int | None = None
    """File size frozen when the path was rotated away from it; None while it is the live file."""


def _notify_nothing(message: str) -> None:
    del message


class FileFollower:
    """Reads one path as a stream of bytes at stream offsets, across rotation and truncation.

    Call `start(committed)` once, then `read()` repeatedly: it never blocks, and returns b""
    when nothing is available yet (poll again later) or, without `follow`, at the end of the
    file (`exhausted` is then true).
    """

    def __init__(
        self,
        path: Path,
        *,
        follow: bool,
        notify: Callable[[str], None] = _notify_nothing,
        known_size: int | None = None,
    ) -> None:
        self.path = path
        self.follow = follow
        self.known_size = known_size
        """The file's size before its writer (`diagnoser run`) began appending: `start` compares
        the server's offset with that, not with a size the new output has already grown."""
        self._notify = notify
        self._segments: list[_Segment] = []
        self._index = 0
        self._position = 0
        self._pending_base = 0
        self._at_eof = False

    @property
    def offset(self) -> int:
        """Stream offset of the next byte `read` hands out."""
        if not self._segments:
            return self._pending_base
        return self._segments[self._index].base + self._position

    @property
    def exhausted(self) -> bool:
        """Without `follow`: everything up to the end of the file has been read."""
        return not self.follow and self._at_eof

    def start(self, committed: int) -> None:
        """Open the file at the committed stream offset (the rule is in the module docstring).

        Raises FileNotFoundError without `follow` (with it, the file is waited for),
        NotARegularFileError or another OSError when it cannot be read.
        """
        self._pending_base = committed
        try:
            segment = self._open()
        except FileNotFoundError:
            if self.follow:
                return
            raise
        size = os.fstat(segment.fd).st_size if self.known_size is None else self.known_size
        if size >= committed:
            segment.base, self._position = 0, committed
        else:
            segment.base, self._position = committed, 0
            if committed:
                self._notify(
                    f"{self.path} is shorter ({size} bytes) than the server's offset {committed}:"
                    " taking it as a new file"
                )
        self._segments = [segment]

    def read(self, size: int = CHUNK_BYTES) -> bytes:
        """Up to `size` bytes at `offset`; b"" if none are ready yet (or ever, if `exhausted`)."""
        if not self._segments and not self._appeared():
            return b""
        while True:
            segment = self._segments[self._index]
            if segment.end is not None:
                data = os.pread(segment.fd, min(size, segment.end - self._position), self._position)
                if data:
                    self._position += len(data)
                    return data
                # Past a rotated file's end (or it shrank since): go on with the next file.
                self._index, self._position = self._index + 1, 0
                continue
            data = os.pread(segment.fd, size, self._position)
            if data and self.follow:
                data = whole_lines(data, size)
            if data:
                self._at_eof = False
                self._position += len(data)
                return data
            self._at_eof = True
            if self.follow and (self._truncated(segment) or self._rotated(segment)):
                continue
            return b""

    def seek(self, offset: int) -> None:
        """Move reading to a stream offset (the server's committed one), to resend from there."""
        if not self._segments:
            self._pending_base = offset
            return
        for index, segment in enumerate(self._segments):
            end = segment.end if segment.end is not None else os.fstat(segment.fd).st_size
            if segment.base <= offset <= segment.base + end:
                self._index, self._position = index, offset - segment.base
                self._at_eof = False
                return
        later = [i for i, segment in enumerate(self._segments) if segment.base > offset]
        if later:
            first = later[0]
            shift = self._segments[first].base - offset
            self._notify(f"{shift} bytes truncated before the server committed them are lost")
            for segment in self._segments[first:]:
                segment.base -= shift
            self._index, self._position = first, 0
        else:
            # The server is ahead of everything this file holds: carry on from its end.
            live = self._segments[-1]
            size = os.fstat(live.fd).st_size
            live.base = offset - size
            self._index, self._position = len(self._segments) - 1, size
        self._at_eof = False

    def release(self, committed: int) -> None:
        """Close rotated-away files the server has committed in full: they will not be resent."""
        while (
            len(self._segments) > 1
            and self._index > 0
            and (first := self._segments[0]).end is not None
            and first.base + first.end <= committed
        ):
            os.close(first.fd)
            del self._segments[0]
            self._index -= 1

    def close(self) -> None:
        for fd in {segment.fd for segment in self._segments}:
            os.close(fd)
        self._segments.clear()

    def _open(self) -> _Segment:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise NotARegularFileError(f"{self.path} is not a regular file")
        return _Segment(fd=fd, base=0, identity=(info.st_dev, info.st_ino))

    def _appeared(self) -> bool:
        """With `follow`, a path missing at start is picked up when it appears: from position 0."""
        if not self.follow:
            return False
        try:
            segment = self._open()
        except FileNotFoundError:
            return False
        segment.base = self._pending_base
        self._segments, self._index, self._position = [segment], 0, 0
        return True

    def _truncated(self, segment: _Segment) -> bool:
        size = os.fstat(segment.fd).st_size
        if size >= self._position:
            return False
        self._notify(f"{self.path} was truncated: reading it again from its start")
        base = segment.base + self._position
        self._segments[self._index] = _Segment(segment.fd, base, segment.identity)
        self._position = 0
        return True

    def _rotated(self, segment: _Segment) -> bool:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return False  # removed, not yet replaced: keep the open file, like tail -F
        if (info.st_dev, info.st_ino) == segment.identity:
            return False
        try:
            successor = self._open()
        except (FileNotFoundError, NotARegularFileError):
            return False
        segment.end = max(os.fstat(segment.fd).st_size, self._position)
        successor.base = segment.base + segment.end
        self._segments.append(successor)
        self._notify(f"{self.path} was rotated: finishing the old file, then following the new one")
        return True
