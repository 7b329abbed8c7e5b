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
