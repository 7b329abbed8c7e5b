"""The seam between ingest and the stages after it: a stage takes framed lines with metadata.

Ingest calls `Pipeline.process` for every batch it frames, inside the request that carried the
bytes. Stages here must be fast and in-memory (framing-speed work: counting, compression, rule
matching); anything slow hands work to a bounded queue of its own so ingest never waits on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from diagnoser.ingest.framing import LineBatch


@dataclass(frozen=True, slots=True)
class StreamKey:
    """Which stream a batch belongs to: the metadata every stage needs."""

    job_id: str
    stream: str
    node: str
    rank: int | None
    attested: bool = field(default=False, compare=False)
    """Sent with a token bound to `node`: hosts the lines name are taken to be `node`."""


class Stage(Protocol):
    def process(self, key: StreamKey, batch: LineBatch) -> None:
        """Consume one batch; must not block on I/O."""


class LineCounter:
    """Counts every line and truncated line that reaches the stages (for /metrics)."""

    def __init__(self) -> None:
        self.lines = 0
        self.truncated = 0

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        self.lines += len(batch.lines)
        self.truncated += batch.truncated


@dataclass
class Pipeline:
    stages: Sequence[Stage] = field(default_factory=list)

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        if not batch.lines:
            return
        for stage in self.stages:
            stage.process(key, batch)
