"""Writing one request's bytes into a stream: dedupe by offset, frame, hand on, commit.

Exactly-once line accounting rests on two facts. Commits are whole lines: the committed offset
is always a line boundary, so a resend that starts anywhere before it is trimmed to the first
byte not yet seen. And a commit moves the offset only from the value this writer read
(compare-and-set), so two writers can never both count the same bytes.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from diagnoser.config import IngestSettings
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.ingest.records import RecordTimes
from diagnoser.ingest.streams import (
    Progress,
    StreamPosition,
    commit_progress,
    open_stream,
    stream_position,
)
from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.store.database import Sessions

KNOWN_STREAMS = 100_000


class OffsetGapError(Exception):
    """The client skipped bytes the server never saw."""

    def __init__(self, expected: int) -> None:
        super().__init__(f"offset is beyond the committed offset {expected}")
        self.expected = expected


class StreamBusyError(Exception):
    """Another request is writing this stream right now (in this process or another)."""


class IdleTimeoutError(Exception):
    """The client stopped sending; what arrived before is committed."""

    def __init__(self, outcome: WriteOutcome) -> None:
        super().__init__("no bytes received within the idle timeout")
        self.outcome = outcome


@dataclass(slots=True)
class WriteTotals:
    """Since the process started, for /metrics."""

    committed_bytes: int = 0
    duplicate_bytes: int = 0
    commits: int = 0


@dataclass(slots=True)
class WriteOutcome:
    lines_accepted: int = 0
    duplicate_bytes: int = 0
    truncated_lines: int = 0
    next_offset: int = 0
    received_bytes: int = 0
    """Body bytes that arrived, duplicates included: 0 means the client sent nothing."""
    diagnoses: list[str] = field(default_factory=list)
    """Diagnoses created or updated by lines of this request."""


AfterCommit = Callable[[StreamKey], Awaitable[list[str]]]
"""Called after each commit, with the lines it made durable already handed to the pipeline."""


@dataclass
class StreamLocks:
    """One lock per live stream; an idle stream's lock is garbage-collected, costing nothing."""

    _locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary
    )

    def get(self, job_id: str, stream: str) -> asyncio.Lock:
        key = (job_id, stream)
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock


@dataclass
class _Commits:
    """Offsets and counts since the last commit of one write."""

    sessions: Sessions
    key: StreamKey
    stream_id: int
    committed: int
    outcome: WriteOutcome
    totals: WriteTotals
    after_commit: AfterCommit | None = None
    lines: int = 0
    truncated: int = 0
    at: float = field(default_factory=time.monotonic)

    def add(self, batch: LineBatch) -> None:
        self.lines += len(batch.lines)
        self.truncated += batch.truncated

    async def commit(self, offset: int) -> None:
        if offset == self.committed and not self.lines:
            return
        progress = Progress(self.committed, offset, self.lines, self.truncated)
        job_id, stream_id = self.key.job_id, self.stream_id
        won = await self.sessions.run(
            lambda conn: commit_progress(conn, job_id, stream_id, progress)
        )
        if not won:
            raise StreamBusyError("the stream's offset moved under this request")
        self.outcome.lines_accepted += self.lines
        self.outcome.truncated_lines += self.truncated
        self.totals.committed_bytes += offset - self.committed
        self.totals.commits += 1
        self.outcome.next_offset = self.committed = offset
        self.lines = self.truncated = 0
        self.at = time.monotonic()
        if self.after_commit is not None:
            for diagnosis_id in await self.after_commit(self.key):
                if diagnosis_id not in self.outcome.diagnoses:
                    self.outcome.diagnoses.append(diagnosis_id)


@dataclass
class StreamWriter:
    sessions: Sessions
    pipeline: Pipeline
    settings: IngestSettings
    locks: StreamLocks
    after_commit: AfterCommit | None = None
    known: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)
    """Stream ids already created: a later request reads its offset in one statement."""
    totals: WriteTotals = field(default_factory=WriteTotals)

    async def _open(self, key: StreamKey, job_metadata: dict[str, str]) -> StreamPosition:
        """Where the stream stands, read fresh: another replica may have written since."""
        cache_key = (key.job_id, key.stream)
        stream_id = self.known.get(cache_key)
        if stream_id is not None and not job_metadata:
            known = stream_id
            position = await self.sessions.run(lambda conn: stream_position(conn, known))
            if position is not None:
                self.known.move_to_end(cache_key)
                return position
        position = await self.sessions.run(
            lambda conn: open_stream(conn, key.job_id, key.stream, key.node, key.rank, job_metadata)
        )
        self.known[cache_key] = position.stream_id
        if len(self.known) > KNOWN_STREAMS:
            self.known.popitem(last=False)
        return position

    async def write(
        self,
        key: StreamKey,
        chunks: AsyncIterator[bytes],
        *,
        offset: int | None,
        job_metadata: dict[str, str],
        times: RecordTimes | None = None,
    ) -> WriteOutcome:
        """Append `chunks` to the stream at `offset` (None: at the committed offset).

        With an offset the body is a byte range: a trailing partial line is not committed and
        must be resent. Without one the body is whole lines: an unterminated last line counts.
        `times` gives the lines of a body built from records the records' own times.
        """
        lock = self.locks.get(key.job_id, key.stream)
        if lock.locked():
            raise StreamBusyError("another request is writing this stream")
        async with lock:
            position = await self._open(key, job_metadata)
            stream_id, committed, lines = position
            if offset is not None and offset > committed:
                raise OffsetGapError(committed)
            outcome = WriteOutcome(next_offset=committed)
            commits = _Commits(
                self.sessions, key, stream_id, committed, outcome, self.totals, self.after_commit
            )
            framer = Framer(committed, lines + 1, max_line_bytes=self.settings.max_line_bytes)
            skip = 0 if offset is None else committed - offset
            body_start = committed if offset is None else offset
            arrivals = _Arrivals(chunks, self.settings.idle_timeout_s)
            try:
                while (
                    chunk := await arrivals.next(self._commit_due_in(framer, commits))
                ) is not None:
                    outcome.received_bytes += len(chunk)
                    if skip:
                        dropped = min(skip, len(chunk))
                        outcome.duplicate_bytes += dropped
                        self.totals.duplicate_bytes += dropped
                        skip -= dropped
                        chunk = chunk[dropped:]
                    if chunk:
                        self._hand_on(key, framer.feed(chunk), commits, times, body_start)
                    # An empty chunk is the commit timer: the lines waiting are committed (and
                    # so diagnosed) although the client sends nothing more for now.
                    if (
                        framer.offset - commits.committed >= self.settings.commit_every_bytes
                        or time.monotonic() - commits.at >= self.settings.commit_every_s
                    ):
                        await commits.commit(framer.offset)
            except TimeoutError:
                await commits.commit(framer.offset)
                raise IdleTimeoutError(outcome) from None
            except BaseException:
                # Client gone or server stopping: keep every whole line that arrived.
                await asyncio.shield(commits.commit(framer.offset))
                raise
            finally:
                arrivals.close()
            if offset is None:
                self._hand_on(key, framer.close(), commits, times, body_start)
            await commits.commit(framer.offset)
            return outcome

    def _hand_on(
        self,
        key: StreamKey,
        batch: LineBatch,
        commits: _Commits,
        times: RecordTimes | None,
        body_start: int,
    ) -> None:
        if times is not None:
            batch = times.stamp(batch, body_start)
        self.pipeline.process(key, batch)
        commits.add(batch)

    def _commit_due_in(self, framer: Framer, commits: _Commits) -> float | None:
        """Seconds until the lines framed but not committed must be; None when there are none."""
        if framer.offset == commits.committed and not commits.lines:
            return None
        return max(0.0, self.settings.commit_every_s - (time.monotonic() - commits.at))


async def _next_or_none(iterator: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        return None


class _Arrivals:
    """A request body's chunks, waited for without giving up on the read when a commit is due.

    The read runs as its own task: cancelling it would end the body, so a timer that fires
    while it waits leaves it running and the next call picks it up.
    """

    def __init__(self, chunks: AsyncIterator[bytes], idle_timeout_s: float) -> None:
        self._iterator = aiter(chunks)
        self._idle_timeout_s = idle_timeout_s
        self._idle_at = time.monotonic() + idle_timeout_s
        self._pending: asyncio.Task[bytes | None] | None = None

    async def next(self, due_in: float | None) -> bytes | None:
        """The next chunk; b"" when `due_in` seconds pass first; None at the end of the body.

        Raises TimeoutError once no chunk came for the idle timeout.
        """
        if self._pending is None:
            self._pending = asyncio.ensure_future(_next_or_none(self._iterator))
        idle_in = self._idle_at - time.monotonic()
        wait = idle_in if due_in is None else min(idle_in, due_in)
        done, _ = await asyncio.wait({self._pending}, timeout=max(wait, 0.0))
        if not done:
            if due_in is not None and due_in <= idle_in:
                return b""
            raise TimeoutError
        chunk, self._pending = self._pending.result(), None
        self._idle_at = time.monotonic() + self._idle_timeout_s
        return chunk

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
