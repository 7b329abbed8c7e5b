"""Record bodies (NDJSON, Fluent Bit's JSON): one log line per record, with optional metadata."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from diagnoser.ingest.schemas import MAX_NAME_LENGTH, MAX_RANK, NAME_PATTERN

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
