"""`diagnoser diagnose`: the same rules and correlation, in-process, on log files.

Each file is one node's log. Files carry no shared clock, so every event without a timestamp
of its own is placed at time 0; correlation then orders by evidence class, not by time.

Files do not say whether their job is still running either. `stalled_for` is the caller's
observation that it is, and that the logs have not advanced for that many seconds (on a live
job: now minus the files' modification time); only with it can a hang be diagnosed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from diagnoser.diagnosis.correlate import Status, Verdict, correlate
from diagnoser.diagnosis.hang import (
    DEFAULT_ACTION,
    DEFAULT_TIMEOUT_S,
    NodeTail,
    TailLine,
    finished,
    hang_verdict,
)
from diagnoser.diagnosis.progress import Progress
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.rules import Action, JobScanner, RuleEvent, RuleSet

READ_BYTES = 256 * 1024
TAIL_LINES = 5


@dataclass(frozen=True, slots=True)
class NodeLog:
    node: str
    path: Path


@dataclass(frozen=True, slots=True)
class OfflineResult:
    verdict: Verdict
    files: Mapping[str, Path]
    """Node name -> the file its lines came from, to point evidence at a file."""

    def evidence_rows(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = []
        for event in self.verdict.evidence[:limit]:
            path = self.files.get(event.node)
            rows.append(
                {
                    "file": str(path) if path else event.node,
                    "line_no": event.line_no,
                    "text": event.text,
                }
            )
        return rows

    def as_json(self) -> dict[str, Any]:
        """The stable `diagnose --json` shape; scripts depend on every key."""
        verdict = self.verdict
        return {
            "status": verdict.status.value,
            "category": verdict.category.value if verdict.category else None,
            "failure_type": verdict.failure_type,
            "action": verdict.action.value,
            "culprit_nodes": list(verdict.culprit_nodes),
            "confidence": round(verdict.confidence, 3),
            "source": verdict.source.value,
            "rule_ids": list(verdict.rule_ids),
            "summary": verdict.summary,
            "evidence": self.evidence_rows(),
        }


def node_logs(paths: Sequence[Path], node_map: Mapping[str, str] | None = None) -> list[NodeLog]:
    """`node-03.log` -> node `node-03`, unless the map names the file (by path or file name)."""
    mapping = node_map or {}
    return [
        NodeLog(mapping.get(str(path)) or mapping.get(path.name) or path.stem, path)
        for path in paths
    ]


def frame_file(handle: BinaryIO) -> Iterator[LineBatch]:
    framer = Framer()
    while chunk := handle.read(READ_BYTES):
        batch = framer.feed(chunk)
        if batch.lines:
            yield batch
    last = framer.close()
    if last.lines:
        yield last


def scan(
    logs: Sequence[NodeLog],
    ruleset: RuleSet,
    tails: list[NodeTail] | None = None,
    progress: Progress | None = None,
) -> list[RuleEvent]:
    """Rule events of every file; `tails` receives each file's last lines and `progress` sees
    every batch, when given (the hang check needs both)."""
    scanner = JobScanner(ruleset)
    events: list[RuleEvent] = []
    for log in logs:
        last: deque[TailLine] = deque(maxlen=TAIL_LINES)
        with log.path.open("rb") as handle:
            for batch in frame_file(handle):
                events.extend(scanner.feed(log.node, None, batch, 0.0))
                if progress is not None:
                    progress.observe(batch)
                start = max(0, len(batch.lines) - TAIL_LINES)
                last.extend(
                    TailLine(batch.lines[i], batch.first_line_no + i, batch.start_of(i))
                    for i in range(start, len(batch.lines))
                )
        events.extend(scanner.flush(log.node, None, 0.0))
        if tails is not None:
            tails.append(NodeTail(log.node, tuple(last)))
    return events


def diagnose(
    logs: Sequence[NodeLog],
    ruleset: RuleSet,
    *,
    stalled_for: float | None = None,
    hang_timeout: float = DEFAULT_TIMEOUT_S,
    hang_action: Action = DEFAULT_ACTION,
) -> OfflineResult:
    tails: list[NodeTail] = []
    progress = Progress()
    events = scan(logs, ruleset, tails, progress)
    verdict = correlate(events, ruleset, [log.node for log in logs])
    if (
        verdict.status is Status.HEALTHY
        and stalled_for is not None
        and stalled_for >= hang_timeout
        and not finished(tails)
    ):
        verdict = hang_verdict(stalled_for, tails, progress.as_record(), action=hang_action)
    return OfflineResult(verdict, {log.node: log.path for log in logs})
