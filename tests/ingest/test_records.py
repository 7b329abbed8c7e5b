"""Record times: which are trusted, and which framed line each one reaches."""

from __future__ import annotations

from diagnoser.ingest.framing import Framer
from diagnoser.ingest.records import (
    MAX_RECORD_AGE_S,
    MAX_RECORD_LEAD_S,
    RecordTimes,
    evidence_time,
    parse_ndjson,
)

NOW = 1_764_000_000.0


def test_a_record_time_is_trusted_inside_the_window_only() -> None:
    assert evidence_time(NOW - 3600, NOW) == NOW - 3600
    assert evidence_time(NOW - MAX_RECORD_AGE_S, NOW) == NOW - MAX_RECORD_AGE_S
    assert evidence_time(NOW + MAX_RECORD_LEAD_S, NOW) == NOW + MAX_RECORD_LEAD_S
    assert evidence_time(NOW - MAX_RECORD_AGE_S - 1, NOW) is None
    assert evidence_time(NOW + MAX_RECORD_LEAD_S + 1, NOW) is None
    assert evidence_time(None, NOW) is None


def test_each_framed_line_gets_the_time_of_the_record_it_came_from() -> None:
    records = parse_ndjson(
        b'{"line": "first", "ts": 1764000000.5}\n'
        b'{"line": "no time"}\n'
        b'{"line": "two\\nlines", "ts": "2025-11-24T16:00:01Z"}\n'
    )
    parts = [record.line.encode() + b"\n" for record in records]
    times = RecordTimes.of([len(p) for p in parts], [evidence_time(r.ts, NOW) for r in records])
    assert times is not None
    body = b"".join(parts)
    # The stream already holds 100 bytes; the body is framed in two awkward pieces.
    framer = Framer(100, 1)
    batches = [framer.feed(body[:9]), framer.feed(body[9:]), framer.close()]
    stamped = [times.stamp(batch, 100) for batch in batches]
    lines = [line for batch in stamped for line in batch.lines]
    ts = [t for batch in stamped if batch.lines for t in batch.ts or []]
    assert lines == ["first", "no time", "two", "lines"]
    second = 1_764_000_001_000_000_000  # 2025-11-24T16:00:01Z, for both lines of its record
    assert ts == [1_764_000_000_500_000_000, None, second, second]


def test_records_without_a_usable_time_stamp_nothing() -> None:
    assert RecordTimes.of([4, 4], [None, None]) is None
