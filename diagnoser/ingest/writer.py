"""Writing one request's bytes into a stream: dedupe by offset, frame, hand on, commit.

Exactly-once line accounting rests on two facts. Commits are whole lines: the committed offset
is always a line boundary, so a resend that starts anywhere before it is trimmed to the first
byte not yet seen. And a commit moves the offset only from the value this writer read
(compare-and-set), so two writers can never both count the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import Connection

from diagnoser.config import IngestSettings
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.ingest.records import RecordTimes
from diagnoser.ingest.streams import (
    Progress,
    StreamCommit,
    StreamPosition,
    commit_many,
    open_stream,
    stream_positions,
)
from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.store.database import Sessions

KNOWN_STREAMS = 100_000
MAX_GROUP = 1000
"""Stream commits per transaction at most: a larger group would hold the database (SQLite's
one writer) long enough to delay everything else that writes."""
TICK_SLICE = 250
"""Timed commits the ticker submits at once. An upload that ends or brings news during a tick
commits in the next transaction, after at most one slice (a few ms), not after the tick's
thousands."""


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
    transactions: int = 0
    """Database transactions those commits took (`CommitGroup`): fewer than commits under load."""
    database_errors: int = 0
    """Offset reads and commits that raised (the database down or busy): the client resends."""


@dataclass(slots=True)
class WriteOutcome:
    lines_accepted: int = 0
    duplicate_bytes: int = 0
    truncated_lines: int = 0
    next_offset: int = 0
    stream_lines: int = 0
    """Lines the stream holds up to `next_offset`: the stream's own count, which a client that
    lost the receipt of an earlier, cut upload (committed late, or by another replica) can
    trust where a sum of its receipts falls short."""
    received_bytes: int = 0
    """Body bytes that arrived, duplicates included: 0 means the client sent nothing."""
    diagnoses: list[str] = field(default_factory=list)
    """Diagnoses created or updated by lines of this request."""


AfterCommit = Callable[[StreamKey], Awaitable[list[str]]]
"""Called after each commit, with the lines it made durable already handed to the pipeline."""
Urgent = Callable[[StreamKey], bool]
"""After a chunk was handed on: whether its lines should be committed now (they carry news
for the diagnosis), not at the next timed commit."""


@dataclass(slots=True)
class _Known:
    """A stream this process has opened: its id, and where this process last left it."""

    stream_id: int
    position: StreamPosition | None = None
    """As this process's last commit left it; kept only for a sole writer (`StreamWriter`)."""


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


T = TypeVar("T")
R = TypeVar("R")


class _Grouped(Generic[T, R]):
    """Requests of every upload in this process that share database transactions: those that
    wait when a transaction ends share the next one, one statement set for all (at most
    MAX_GROUP requests).

    A request that finds no transaction running starts one at the next turn of the event
    loop, so those queued in the same turn join it; one that arrives while a transaction runs
    joins the next. Nothing waits for a clock: a lone request costs what it cost alone. A
    failed transaction fails every request in it.
    """

    name = "group"
    """What the error says when the event loop stops with requests still queued."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    def _run(self, conn: Connection, items: list[T]) -> list[R]:
        """The answers to `items`, in their order, in one transaction (`conn`)."""
        raise NotImplementedError

    def _counted(self) -> None:
        """One more transaction taken."""

    def _enqueue(self, items: list[T]) -> list[asyncio.Future[R]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = [loop.create_future() for _ in items]
        self._queue.extend(zip(items, futures, strict=True))
        if self._task is None:
            self._task = asyncio.create_task(self._drain())
        return futures

    async def _submit(self, item: T) -> R:
        return await self._enqueue([item])[0]

    async def _submit_all(self, items: list[T]) -> list[R | Exception]:
        """Each item's answer, or the error of the transaction it was in: one wait for all.

        The queue is served in order, so once the last item's answer is in, every earlier one
        is too.
        """
        if not items:
            return []
        futures = self._enqueue(items)
        await asyncio.wait([futures[-1]])
        answers: list[R | Exception] = []
        for future in futures:
            error = future.exception()
            answers.append(future.result() if error is None else _as_exception(error))
        return answers

    async def _drain(self) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            await asyncio.sleep(0)  # the requests queued in this turn of the loop come along
            while self._queue:
                batch = self._queue[:MAX_GROUP]
                del self._queue[:MAX_GROUP]
                items = [item for item, _ in batch]
                try:
                    answers = await self.sessions.run(functools.partial(self._run, items=items))
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), answer in zip(batch, answers, strict=True):
                        if not future.done():
                            future.set_result(answer)
                self._counted()
                batch = []
        finally:
            self._task = None
            for _, future in [*batch, *self._queue]:
                if not future.done():  # only when the loop itself is stopping
                    future.set_exception(RuntimeError(f"the {self.name} stopped"))
            self._queue.clear()


def _as_exception(error: BaseException) -> Exception:
    return error if isinstance(error, Exception) else RuntimeError(repr(error))


class CommitGroup(_Grouped[StreamCommit, bool]):
    """The stream commits of every upload in this process, taken together (group commit).

    Under load the uploads' timed commits come together (`CommitTicker`), so an interval's
    commits of thousands of open uploads take a few transactions instead of one each. Each
    commit keeps its own compare-and-set: a lost race fails that stream alone; a failed
    transaction fails every commit in it, and nothing of it is committed.
    """

    name = "commit group"

    def __init__(self, sessions: Sessions, totals: WriteTotals) -> None:
        super().__init__(sessions)
        self.totals = totals

    async def commit(self, commit: StreamCommit) -> bool:
        """True once `commit` is durable; False when the stream's offset had moved."""
        return await self._submit(commit)

    async def commit_all(self, commits: list[StreamCommit]) -> list[bool | Exception]:
        """`commit` for each, with one wait: the error of a failed transaction in place of
        the answers of the commits it held."""
        return await self._submit_all(commits)

    def _run(self, conn: Connection, items: list[StreamCommit]) -> list[bool]:
        return commit_many(conn, items)

    def _counted(self) -> None:
        self.totals.transactions += 1


class PositionGroup(_Grouped[int, StreamPosition | None]):
    """The position reads of every upload of a known stream in this process, taken together,
    as `CommitGroup` does for commits: one statement for the reads that wait.

    Each read is still made after its upload holds its stream's lock, so it is as fresh as a
    read of its own; a lone read costs what it cost alone.
    """

    name = "position group"

    def __init__(self, sessions: Sessions) -> None:
        super().__init__(sessions)
        self.transactions = 0
        """Transactions the reads took so far (fewer than reads under load)."""

    async def read(self, stream_id: int) -> StreamPosition | None:
        """Where the stream stands now, or None if it no longer exists."""
        return await self._submit(stream_id)

    def _run(self, conn: Connection, items: list[int]) -> list[StreamPosition | None]:
        found = stream_positions(conn, sorted(set(items)))
        return [found.get(stream_id) for stream_id in items]

    def _counted(self) -> None:
        self.transactions += 1


@dataclass(eq=False)
class _Commits:
    """Offsets and counts since the last commit of one write.

    The request's loop and the process's `CommitTicker` both commit; the lock makes them take
    turns, and each commit reads the framer's offset and the counts together, with no await in
    between, so they always describe the same lines.
    """

    group: CommitGroup
    key: StreamKey
    stream_id: int
    framer: Framer
    outcome: WriteOutcome
    totals: WriteTotals
    after_commit: AfterCommit | None = None
    known: _Known | None = None
    """Where the stream's position is remembered after each commit (None: not remembered)."""
    lines: int = 0
    truncated: int = 0
    at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting_since: float | None = None
    """When the oldest line handed on but not yet committed was framed (None: none waits)."""
    failure: Exception | None = None
    """What a timed commit raised, for the request to raise at its next chunk or its end."""
    committed: int = field(init=False)
    """The stream's committed offset, as this write last moved it."""

    def __post_init__(self) -> None:
        self.committed = self.framer.offset

    def add(self, batch: LineBatch) -> None:
        self.lines += len(batch.lines)
        self.truncated += batch.truncated
        if self.waiting_since is None and batch.lines:
            self.waiting_since = time.monotonic()

    def _forget(self) -> None:
        """After a failed commit the stream is read again at the next upload's start."""
        if self.known is not None:
            self.known.position = None

    @property
    def pending(self) -> bool:
        """Lines framed and handed on, not yet committed."""
        return self.framer.offset != self.committed or self.lines > 0

    def raise_failure(self) -> None:
        """Raise what a timed commit of this write raised, once."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def progress(self) -> Progress | None:
        """What a commit now would write (None: nothing waits). Read with the lock held."""
        offset, lines = self.framer.offset, self.lines
        if offset == self.committed and not lines:
            return None
        return Progress(self.committed, offset, lines, self.truncated)

    def settled(self, progress: Progress, won: bool | Exception) -> None:
        """Book the answer to a commit of `progress`; raise if it did not move the stream."""
        if isinstance(won, Exception):
            self._forget()
            self.totals.database_errors += 1
            raise won
        if not won:
            self._forget()
            raise StreamBusyError("the stream's offset moved under this request")
        lines, truncated, offset = progress.lines, progress.truncated_lines, progress.to_offset
        self.outcome.lines_accepted += lines
        self.outcome.stream_lines += lines
        self.outcome.truncated_lines += truncated
        self.totals.committed_bytes += offset - self.committed
        self.totals.commits += 1
        self.outcome.next_offset = self.committed = offset
        if self.known is not None:
            self.known.position = StreamPosition(self.stream_id, offset, self.outcome.stream_lines)
        self.lines -= lines
        self.truncated -= truncated
        self.at = time.monotonic()
        self.waiting_since = self.at if self.lines else None

    def touched(self, diagnosis_ids: list[str]) -> None:
        for diagnosis_id in diagnosis_ids:
            if diagnosis_id not in self.outcome.diagnoses:
                self.outcome.diagnoses.append(diagnosis_id)

    async def commit(self) -> None:
        async with self.lock:
            progress = self.progress()
            if progress is None:
                return
            commit = StreamCommit(self.key.job_id, self.stream_id, progress)
            try:
                won: bool | Exception = await self.group.commit(commit)
            except Exception as exc:
                won = exc
            self.settled(progress, won)
            if self.after_commit is not None:
                self.touched(await self.after_commit(self.key))


class CommitTicker:
    """The timed commits of every open upload in the process, taken together at each tick.

    A line handed on waits at most `every_s` for its commit, even if no byte follows it:
    without that, a failure line at the tail of an open upload (the process that printed it
    died, the upload stays open) would wait for the next chunk, the end of the request or the
    idle timeout. The ticks fall on multiples of `every_s` on the loop's clock; at each, every
    write with lines waiting is committed through the commit group in one submission (a few
    transactions for thousands of uploads), then each job's diagnosis is settled once. One
    timer for the process instead of a timer, a task and a wait per upload per tick: the
    per-upload cost of the tick is a few attribute reads.

    A write whose own commit is running at the tick (its lock held) is taken at the next one;
    a timed commit that fails is raised by its request (`arm` at its next chunk, `withdraw`
    at its end), as a commit of its own would be.
    """

    def __init__(
        self, group: CommitGroup, every_s: float, after_commit: AfterCommit | None
    ) -> None:
        self.group = group
        self.every_s = every_s
        self.after_commit = after_commit
        self._waiting: dict[_Commits, None] = {}
        """Writes with lines that wait for the next tick, in arrival order."""
        self._handle: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None
        self.ticks = 0

    def arm(self, commits: _Commits) -> None:
        """After each chunk: raise what a timed commit raised; else wait for the tick if
        lines wait."""
        commits.raise_failure()
        if commits.pending:
            self._waiting[commits] = None
            self._schedule()

    async def withdraw(self, commits: _Commits) -> None:
        """No more timed commits of this write: wait for one in flight, raise its error."""
        self._waiting.pop(commits, None)
        if commits.lock.locked():
            async with commits.lock:
                pass
        commits.raise_failure()

    def _schedule(self) -> None:
        if self._handle is not None or self._running is not None or not self._waiting:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = math.floor(now / self.every_s + 1) * self.every_s
        self._handle = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._running = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        try:
            due = [c for c in self._waiting if not c.lock.locked()]
            for commits in due:  # a write committing itself now is taken at the next tick
                del self._waiting[commits]
            committed: list[_Commits] = []
            for start in range(0, len(due), TICK_SLICE):
                committed += await self._commit_slice(due[start : start + TICK_SLICE])
            await self._settle(committed)
        finally:
            self._running = None
            self.ticks += 1
            self._schedule()

    async def _commit_slice(self, due: list[_Commits]) -> list[_Commits]:
        """Commit these writes (those still waiting and not committing themselves) in one
        submission to the commit group; the writes committed."""
        taken: list[_Commits] = []
        progress: list[Progress] = []
        for commits in due:
            if commits.lock.locked():  # ended or urgent since the tick began: its own commit
                self._waiting.setdefault(commits, None)
                continue
            if commits.failure is not None:
                continue
            step = commits.progress()
            if step is None:
                continue
            await commits.lock.acquire()  # free, so taken without a suspension
            taken.append(commits)
            progress.append(step)
        batch = [
            StreamCommit(c.key.job_id, c.stream_id, p) for c, p in zip(taken, progress, strict=True)
        ]
        try:
            answers = await self.group.commit_all(batch)
        except BaseException:
            for commits in taken:
                commits.lock.release()
            raise
        done = []
        for commits, step, won in zip(taken, progress, answers, strict=True):
            try:
                commits.settled(step, won)
            except Exception as exc:
                commits.failure = exc
            else:
                done.append(commits)
                if commits.pending:
                    self._waiting[commits] = None  # lines that arrived while it committed
            finally:
                commits.lock.release()
        return done

    async def _settle(self, committed: list[_Commits]) -> None:
        """Each job whose lines were committed is settled once; what it touched goes to the
        answer of the first of its uploads in the tick."""
        if self.after_commit is None:
            return
        first: dict[str, _Commits] = {}
        for commits in committed:
            first.setdefault(commits.key.job_id, commits)
        for commits in first.values():
            try:
                commits.touched(await self.after_commit(commits.key))
            except Exception as exc:
                commits.failure = exc


class _IdleDeadline:
    """The chunks of one upload, read with an idle timeout: `next` raises `TimeoutError` once a
    read has waited `idle_s` for its chunk.

    One clock per upload, pushed forward lazily: a read notes when it started waiting, and the
    clock, when it fires, either finds that read past its deadline or sets itself again for
    it, about once per `idle_s` while bytes flow. A timeout context per chunk cost a timer
    armed and cancelled per chunk. As with that context, only the wait for a chunk counts, not
    the time spent on one (framing, a commit), and the expiry cancels the waiting read and
    turns that cancellation, not another, into `TimeoutError`.
    """

    def __init__(self, chunks: AsyncIterator[bytes], idle_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "an upload is read inside a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = asyncio.get_running_loop()
        self._iterator = aiter(chunks)
        self._idle_s = idle_s
        self._since: float | None = None
        """When the read in progress started waiting (None: no read waits)."""
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False

    async def next(self) -> bytes | None:
        """The next chunk, or None at the end of the body."""
        self._since = now = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(now + self._idle_s, self._check)
        try:
            return await anext(self._iterator)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError as exc:
            if self._expiry_taken():
                raise TimeoutError from exc
            raise
        finally:
            self._since = None
            self._expiry_taken()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        since = self._since
        if since is None:  # busy with a chunk: the next read sets the clock again
            return
        deadline = since + self._idle_s
        if self._loop.time() < deadline:
            self._handle = self._loop.call_at(deadline, self._check)
        else:
            self._expired = True
            self._task.cancel()

    def _expiry_taken(self) -> bool:
        """Withdraw this clock's cancellation, if it made one: True if no other is pending."""
        if not self._expired:
            return False
        self._expired = False
        return self._task.uncancel() <= self._cancelling


@dataclass
class StreamWriter:
    sessions: Sessions
    pipeline: Pipeline
    settings: IngestSettings
    locks: StreamLocks
    after_commit: AfterCommit | None = None
    urgent: Urgent | None = None
    sole_writer: bool = False
    """No other process writes these streams (the embedded SQLite database, which one process
    serves): an upload of a stream this process committed before starts where that commit
    left it, without reading it. With several replicas (PostgreSQL) another may have written
    since, so every upload reads its stream's position."""
    known: OrderedDict[tuple[str, str], _Known] = field(default_factory=OrderedDict)
    """Streams already created: a later request reads its offset in one statement, or, for a
    sole writer, not at all."""
    totals: WriteTotals = field(default_factory=WriteTotals)
    group: CommitGroup = field(init=False)
    positions: PositionGroup = field(init=False)
    ticker: CommitTicker = field(init=False)
    active: set[_Commits] = field(default_factory=set)
    """The writes in progress: what the ingest lag is measured over."""

    def __post_init__(self) -> None:
        self.group = CommitGroup(self.sessions, self.totals)
        self.positions = PositionGroup(self.sessions)
        self.ticker = CommitTicker(self.group, self.settings.commit_every_s, self.after_commit)

    def uncommitted_age_s(self) -> float:
        """How long the oldest line framed but not yet committed has waited (0: none waits).

        Normally at most about `commit_every_s`; it grows while commits are slow or fail (the
        database down, busy or far away): the ingest lag worth an alert.
        """
        waiting = [c.waiting_since for c in self.active if c.waiting_since is not None]
        return time.monotonic() - min(waiting) if waiting else 0.0

    async def _open(
        self, key: StreamKey, job_metadata: dict[str, str]
    ) -> tuple[StreamPosition, _Known]:
        try:
            return await self._position(key, job_metadata)
        except Exception:  # the database down or busy: counted, and the client told to retry
            self.totals.database_errors += 1
            raise

    async def _position(
        self, key: StreamKey, job_metadata: dict[str, str]
    ) -> tuple[StreamPosition, _Known]:
        """Where the stream stands: read fresh (another replica may have written since), or, for
        a sole writer, as this process's last commit left it."""
        cache_key = (key.job_id, key.stream)
        known = self.known.get(cache_key)
        if known is not None and not job_metadata:
            position = known.position
            if position is None:
                position = await self.positions.read(known.stream_id)
            if position is not None:
                self.known.move_to_end(cache_key)
                return self._remembered(position, known)
        position = await self.sessions.run(
            lambda conn: open_stream(conn, key.job_id, key.stream, key.node, key.rank, job_metadata)
        )
        known = _Known(position.stream_id)
        self.known[cache_key] = known
        if len(self.known) > KNOWN_STREAMS:
            self.known.popitem(last=False)
        return self._remembered(position, known)

    def _remembered(self, position: StreamPosition, known: _Known) -> tuple[StreamPosition, _Known]:
        if self.sole_writer:
            known.position = position
        return position, known

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
            position, known = await self._open(key, job_metadata)
            stream_id, committed, lines = position
            if offset is not None and offset > committed:
                raise OffsetGapError(committed)
            outcome = WriteOutcome(next_offset=committed, stream_lines=lines)
            framer = Framer(committed, lines + 1, max_line_bytes=self.settings.max_line_bytes)
            commits = _Commits(
                self.group,
                key,
                stream_id,
                framer,
                outcome,
                self.totals,
                self.after_commit,
                known if self.sole_writer else None,
            )
            # bytes already committed, to drop; where the body starts in the stream
            skip, body_start = (0, committed) if offset is None else (committed - offset, offset)
            idle = _IdleDeadline(chunks, self.settings.idle_timeout_s)
            self.active.add(commits)
            try:
                try:
                    while (chunk := await idle.next()) is not None:
                        outcome.received_bytes += len(chunk)
                        if skip:
                            dropped = min(skip, len(chunk))
                            outcome.duplicate_bytes += dropped
                            self.totals.duplicate_bytes += dropped
                            skip -= dropped
                            chunk = chunk[dropped:]
                        if not chunk:
                            continue
                        self._hand_on(key, framer.feed(chunk), commits, times, body_start)
                        if (
                            framer.offset - commits.committed >= self.settings.commit_every_bytes
                            or (self.urgent is not None and self.urgent(key))
                        ):
                            await commits.commit()
                        self.ticker.arm(commits)
                    await self.ticker.withdraw(commits)
                except TimeoutError:
                    await self.ticker.withdraw(commits)
                    await commits.commit()
                    raise IdleTimeoutError(outcome) from None
                except BaseException:
                    # Client gone or server stopping: keep every whole line that arrived.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.ticker.withdraw(commits))
                    await asyncio.shield(commits.commit())
                    raise
                if offset is None:
                    self._hand_on(key, framer.close(), commits, times, body_start)
                await commits.commit()
                return outcome
            finally:
                idle.close()
                self.active.discard(commits)

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
