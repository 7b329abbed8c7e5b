"""Record bodies (NDJSON, Fluent Bit's JSON): one log line per record, with optional metadata."""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import accumulate
from typing import Any

from diagnoser.ingest.framing import LineBatch
from diagnoser.ingest.schemas import MAX_NAME_LENGTH, MAX_RANK, NAME_PATTERN

MAX_RECORD_AGE_S = 7 * 24 * 3600.0
"""A record time older than this (before its arrival) is not trusted: a week covers a Fluent Bit
buffer replayed after an outage; 1970 or a zero means a sender that filled the field blindly."""
MAX_RECORD_LEAD_S = 300.0
"""A record time this far ahead of the server's clock is not trusted: skew is minutes, not more
(a time in milliseconds read as seconds lands thousands of years ahead)."""

_NODE = re.compile(NAME_PATTERN)


class RecordError(ValueError):
    """A body that is not what its content type promises; the message says where."""


@dataclass(frozen=True, slots=True)
class Record:
    line: str
    node: str | None = None
    rank: int | None = None
    ts: float | None = None
    """Seconds since the epoch, when the record carried a time."""


def parse_time(value: object) -> float | None:
    """RFC 3339 text or epoch seconds (Fluent Bit sends a float); anything else is no time."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _rank(value: object, where: str) -> int | None:
    """An integer or its decimal text (labels are strings), within the range the API accepts."""
    if value is None:
        return None
    if (isinstance(value, str) and value.isascii() and value.isdigit()) or (
        isinstance(value, float) and value.is_integer()
    ):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RANK:
        raise RecordError(f"{where}: rank must be an integer from 0 to {MAX_RANK}")
    return value


def _node(value: object, where: str) -> str | None:
    """Validated like the `node` query parameter: it becomes a stream id and a culprit."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(f"{where}: node must be a string")
    if len(value) > MAX_NAME_LENGTH or not _NODE.fullmatch(value):
        raise RecordError(
            f"{where}: node must be a name of at most {MAX_NAME_LENGTH} characters "
            "(letters, digits and _ . : @ -)"
        )
    return value


MESSAGE_KEYS = ("line", "log", "message")
"""Ours, Fluent Bit's and Vector's names for the text of a record."""
TIME_KEYS = ("ts", "date", "timestamp", "time")


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((obj[key] for key in keys if key in obj), None)


def _from_object(obj: Any, where: str) -> Record:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected a JSON object")
    texts = [obj[key] for key in MESSAGE_KEYS if key in obj]
    if not texts or not all(isinstance(text, str) for text in texts):
        raise RecordError(f"{where}: missing string field 'line' (or 'log', 'message')")
    line: str = texts[0]
    node = _node(obj.get("node"), where)
    kubernetes = obj.get("kubernetes")
    if isinstance(kubernetes, dict):
        # Fluent Bit's kubernetes filter names the node here.
        host = _node(kubernetes.get("host"), f"{where}: kubernetes.host")
        node = node or host
    elif kubernetes is not None:
        raise RecordError(f"{where}: kubernetes must be an object")
    return Record(
        line=line.rstrip("\r\n"),
        node=node,
        rank=_rank(obj.get("rank"), where),
        ts=parse_time(_first(obj, TIME_KEYS)),
    )


def parse_ndjson(body: bytes) -> list[Record]:
    """`{"line": str, "ts": ..., "node": ..., "rank": ...}` per line; blank lines are skipped.

    Fluent Bit's `format json_lines` (`log`, `date`) and Vector's NDJSON (`message`,
    `timestamp`) are read the same way.
    """
    records = []
    for number, raw in enumerate(body.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise RecordError(f"line {number}: not valid JSON ({exc})") from exc
        except RecursionError as exc:
            raise RecordError(f"line {number}: JSON nested too deeply") from exc
        records.append(_from_object(obj, f"line {number}"))
    return records


def parse_fluent_bit(body: bytes) -> list[Record]:
    """Fluent Bit's `http` output with `format json`: an array of records, `log` and `date`."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise RecordError(f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise RecordError("JSON nested too deeply") from exc
    if isinstance(payload, dict):
        payload = [payload]
    if not isinstance(payload, list):
        raise RecordError("expected a JSON array of records")
    return [_from_object(obj, f"record {index}") for index, obj in enumerate(payload)]


def evidence_time(ts: float | None, received: float) -> float | None:
    """The record's own time when it is sane next to `received` (see the two bounds above);
    None otherwise, and the line then gets the receive time as any raw line does."""
    if ts is None or not received - MAX_RECORD_AGE_S <= ts <= received + MAX_RECORD_LEAD_S:
        return None
    return ts


@dataclass(frozen=True, slots=True)
class RecordTimes:
    """The times of the records a body was built from, by byte position in that body.

    Records become lines of a byte stream (one record's text may hold several lines), so a
    framed line finds its record by where it ends, wherever the framer cut its batches.
    """

    ends: list[int]
    """Body position just past each record's bytes."""
    times: list[int | None]
    """Each record's sane time in Unix epoch nanoseconds (as `LineBatch.ts`), or None."""

    @classmethod
    def of(cls, sizes: list[int], times: list[float | None]) -> RecordTimes | None:
        """None when no record carries a usable time: nothing to stamp."""
        if all(t is None for t in times):
            return None
        nanos = [None if t is None else round(t * 1_000_000_000) for t in times]
        return cls(list(accumulate(sizes)), nanos)

    def stamp(self, batch: LineBatch, body_start: int) -> LineBatch:
        """`batch` with each line's record time, where the line has no time of its own (a CRI
        header's, which is the runtime's exact write time)."""
        if not batch.lines:
            return batch
        ts: list[int | None] = [None] * len(batch.lines) if batch.ts is None else list(batch.ts)
        for index, end in enumerate(batch.ends):
            if ts[index] is None:
                record = bisect_right(self.ends, end - 1 - body_start)
                if record < len(self.times):
                    ts[index] = self.times[record]
        return replace(batch, ts=ts)
