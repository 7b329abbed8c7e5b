"""The only module that touches `hyperscan`: a typed literal-set scanner over byte chunks.

hyperscan ships no type stubs; everything it returns is narrowed here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

_hs: Any
try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised where wheels are missing
    _hs = None


def available() -> bool:
    return _hs is not None


class LiteralScanner:
    """Finds every occurrence of a fixed set of literals in a chunk, in one pass.

    `scan` returns (end_offset, literal_id) pairs sorted by end offset. A scratch space is not
    shareable between concurrent scans, hence the lock.
    """

    __slots__ = ("_db", "_lock", "_scratch")

    def __init__(self, literals: Sequence[tuple[bytes, bool]]) -> None:
        if _hs is None:
            raise RuntimeError("hyperscan is not installed")
        db: Any = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        flags = [_hs.HS_FLAG_CASELESS if caseless else 0 for _, caseless in literals]
        db.compile(
            expressions=[lit for lit, _ in literals],
            ids=list(range(len(literals))),
            elements=len(literals),
            flags=flags,
            literal=True,
        )
        self._db = db
        self._scratch: Any = _hs.Scratch(db)
        self._lock = threading.Lock()

    def scan(self, data: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(lit_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            append((end, lit_id))

        with self._lock:
            self._db.scan(data, match_event_handler=on_match, scratch=self._scratch)
        if any(hits[i][0] > hits[i + 1][0] for i in range(len(hits) - 1)):
            hits.sort()
        return hits


class PatternScanner:
    """Finds where any of a set of regexes ends a match in a chunk, in one pass.

    Patterns are compiled in multi-line mode (`^` and `$` at every line); `allow_empty` lets a
    pattern match an empty line (the filter of blank lines). `scan` returns
    (end_offset, pattern_id) pairs in the order hyperscan reports them (by end offset). Patterns
    hyperscan rejects raise `ValueError` naming the first one, so callers can refuse it alone.
    """

    __slots__ = ("_db", "_lock", "_scratch")

    def __init__(
        self, patterns: Sequence[tuple[bytes, bool]], *, allow_empty: bool = False
    ) -> None:
        if _hs is None:
            raise RuntimeError("hyperscan is not installed")
        db: Any = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        base = _hs.HS_FLAG_MULTILINE | (_hs.HS_FLAG_ALLOWEMPTY if allow_empty else 0)
        flags = [base | (_hs.HS_FLAG_CASELESS if caseless else 0) for _, caseless in patterns]
        try:
            db.compile(
                expressions=[p for p, _ in patterns],
                ids=list(range(len(patterns))),
                elements=len(patterns),
                flags=flags,
            )
        except _hs.error as exc:
            raise ValueError(f"hyperscan cannot compile: {exc}") from exc
        self._db = db
        self._scratch: Any = _hs.Scratch(db)
        self._lock = threading.Lock()

    def scan(self, data: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(pattern_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            append((end, pattern_id))

        with self._lock:
            self._db.scan(data, match_event_handler=on_match, scratch=self._scratch)
        return hits


def compiles(pattern: bytes) -> str | None:
    """None when hyperscan accepts `pattern` as the filter matcher compiles it, else why not."""
    try:
        PatternScanner([(pattern, False)], allow_empty=True)
    except ValueError as exc:
        return str(exc)
    return None
