"""`diagnoser diagnose`: the same rules and correlation, in-process, on log files.

Each file is one node's log, named after the file, except for lines that name their host (a
journal export, a syslog server's file, pdsh output): those are that host's. Files carry no
shared clock, so every event without a timestamp of its own is placed at time 0; correlation
then orders by evidence class, not by time.

Files do not say whether their job is still running either. `stalled_for` is the caller's
observation that it is, and that the logs have not advanced for that many seconds (on a live
job: now minus the files' modification time); only with it can a hang be diagnosed.

When the rules end in `escalate` and an LLM is configured, `consult` asks it as the live stage
does (diagnosis/trace.py's trace of the rule events and the files' last lines, redacted, k
samples, the same threshold) and applies the vote by the flow's rule; no database, no cache.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby
from pathlib import Path
from typing import Any, BinaryIO

from diagnoser.config import LlmSettings
from diagnoser.diagnosis.correlate import Source, Status, Verdict, correlate
from diagnoser.diagnosis.hang import (
    DEFAULT_ACTION,
    DEFAULT_TIMEOUT_S,
    NodeTail,
    TailLine,
    finished,
    hang_verdict,
)
from diagnoser.diagnosis.progress import Progress
from diagnoser.diagnosis.signals import FAILURE_TYPES as SIGNAL_TYPES
from diagnoser.diagnosis.signals import SignalReader, unexplained, with_resume
from diagnoser.diagnosis.trace import Trace, assemble
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.ingest.prefixes import LineHosts, host_of
from diagnoser.rules import Action, Category, JobScanner, RuleEvent, RuleSet
from diagnoser.templates.signals import SignalConfig

READ_BYTES = 256 * 1024
TAIL_LINES = 5


@dataclass(frozen=True, slots=True)
class NodeLog:
    node: str
    path: Path
    mapped: bool = False
    """The node was named by the caller (`--node-map`): lines' host headers do not override it."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an event's line came from, and how its node got its name."""

    path: Path
    naming: str
    """How the node was named: a host header's kind, or FILE_NAMED / MAP_NAMED."""


FILE_NAMED = "file name"
MAP_NAMED = "node map"
CONTINUATION = "continuation"

EventKey = tuple[str, int, int]
"""(node, offset, line_no): one event's line; offsets are unique within a file."""


def _key(event: RuleEvent) -> EventKey:
    return (event.node, event.offset, event.line_no)


@dataclass(frozen=True, slots=True)
class OfflineResult:
    verdict: Verdict
    files: Mapping[str, Path]
    """Node name -> the (first) file its lines came from, to point evidence at a file."""
    origins: Mapping[EventKey, Origin] = field(default_factory=dict)
    """Per event: its file, and how its node was named."""
    events: tuple[RuleEvent, ...] = ()
    tails: tuple[NodeTail, ...] = ()
    progress: Mapping[str, int] | None = None
    llm: Mapping[str, Any] | None = None
    """The LLM's vote record (decided or not) when one was asked, as the service stores it."""
    resume_from_step: int | None = None
    """After a NaN loss or a loss spike: the step of the last checkpoint saved before it."""

    @property
    def unresolved(self) -> bool:
        """The rules leave it to a human: what the LLM is asked about."""
        return self.verdict.action is Action.ESCALATE and self.verdict.source is not Source.LLM

    def trace(self, job_id: str) -> Trace:
        """What the LLM is shown: the live stage's trace, from the files' events and tails."""
        return assemble(job_id, self.events, self.tails, (), self.progress, frozenset(self.files))

    def with_llm(self, record: Mapping[str, Any]) -> OfflineResult:
        """The vote kept, and applied as the flow applies it: only decided, only when it is
        more than an escalation; the rules' evidence stays the evidence."""
        decides = (
            record.get("decided") is True
            and record.get("action") != Action.ESCALATE.value
            and self.unresolved
        )
        if not decides:
            return replace(self, llm=record)
        k = int(record["k"])
        confidence = float(record["confidence"])
        verdict = replace(
            self.verdict,
            status=Status.FAILURE,
            action=Action(record["action"]),
            failure_type=record["failure_type"],
            category=Category(record["category"]),
            culprit_nodes=tuple(record["culprit_nodes"]),
            confidence=confidence,
            source=Source.LLM,
            summary=f"LLM ({round(confidence * k)} of {k} samples agree): {record['summary']}",
        )
        return replace(self, verdict=verdict, llm=record)

    def origin(self, event: RuleEvent) -> Origin | None:
        found = self.origins.get(_key(event))
        if found is None and (path := self.files.get(event.node)) is not None:
            return Origin(path, FILE_NAMED)
        return found

    def evidence_rows(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = []
        for event in self.verdict.evidence[:limit]:
            origin = self.origin(event)
            rows.append(
                {
                    "file": str(origin.path) if origin else event.node,
                    "line_no": event.line_no,
                    "text": event.text,
                    "node": event.node,
                    "rule_id": event.rule_id,
                    "entities": dict(event.entities),
                }
            )
        return rows

    def culprit_reason(self) -> str | None:
        """One sentence per culprit: why that node, and where its name comes from."""
        verdict = self.verdict
        if not verdict.culprit_nodes:
            return None
        return " ".join(self._reason(node) for node in verdict.culprit_nodes)

    def _reason(self, node: str) -> str:
        verdict, root = self.verdict, self.verdict.root
        if verdict.source is Source.LLM and self.llm is not None:
            return self._llm_reason(node, self.llm)
        if root is not None and root.entities.get("host") == node:
            return (
                f"{node}: torchrun's root-cause report (line {root.line_no} of "
                f"{self._file(root)}) names it as the host of the first failure."
            )
        event = next((e for e in verdict.evidence if e.node == node), None)
        if event is None:
            return f"{node}: inferred, it reported no timeout while the other nodes timed out."
        if event.category is Category.HARDWARE:
            why = "its hardware error"
        elif root is event and "inferred" in verdict.summary:
            why = "its ranks' NCCL progress is behind the others'"
        elif root is event:
            why = "the first failure happened there"
        else:
            why = "its evidence"
        where = f"{event.rule_id}, line {event.line_no} of {self._file(event)}"
        return f"{node}: {why} ({where}); {self._named(event, node)}"

    @staticmethod
    def _llm_reason(node: str, record: Mapping[str, Any]) -> str:
        """The vote named it; the answer check let it through only on its own cited lines."""
        k = int(record["k"])
        agree = round(float(record["confidence"]) * k)
        cited = [e for e in record.get("evidence") or [] if e.get("node") == node]
        why = f"{node}: {agree} of {k} LLM samples name it"
        if not cited:
            return f"{why}."
        return f"{why}, citing its own line {cited[0]['text']!r}."

    def _file(self, event: RuleEvent) -> str:
        origin = self.origin(event)
        return origin.path.name if origin else event.node

    def _named(self, event: RuleEvent, node: str) -> str:
        origin = self.origin(event)
        if origin is None or origin.naming == FILE_NAMED:
            return "the line names no host, so the node is named after its file."
        if origin.naming == MAP_NAMED:
            return f"--node-map names {origin.path.name}'s node {node}."
        if origin.naming == CONTINUATION:
            return f"it continues a line whose header names host {node}."
        return f"the line's {origin.naming} names host {node}."

    def as_json(self) -> dict[str, Any]:
        """The stable `diagnose --json` shape; scripts depend on every key (add, never drop)."""
        verdict = self.verdict
        entities = verdict.root.entities if verdict.root is not None else {}
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
            "culprit_reason": self.culprit_reason(),
            "xid": entities.get("xid"),
            "pci": entities.get("pci"),
            "votes": dict(self.llm) if self.llm is not None else None,
            "resume_from_step": self.resume_from_step,
        }


def node_logs(paths: Sequence[Path], node_map: Mapping[str, str] | None = None) -> list[NodeLog]:
    """`node-03.log` -> node `node-03`, unless the map names the file (by path or file name).

    Lines that name their host (syslog, journald, srun, pdsh headers) belong to that host
    instead, unless the map named the file.
    """
    mapping = node_map or {}
    logs = []
    for path in paths:
        mapped = mapping.get(str(path)) or mapping.get(path.name)
        logs.append(NodeLog(mapped or path.stem, path, mapped is not None))
    return logs


def frame_file(handle: BinaryIO) -> Iterator[LineBatch]:
    framer = Framer()
    while chunk := handle.read(READ_BYTES):
        batch = framer.feed(chunk)
        if batch.lines:
            yield batch
    last = framer.close()
    if last.lines:
        yield last


def _part(batch: LineBatch, start: int, stop: int) -> LineBatch:
    """Lines start..stop of a batch as a batch of their own (same offsets and numbers)."""

    def cut(values: list[int | None] | None) -> list[int | None] | None:
        return None if values is None else values[start:stop]

    return LineBatch(
        stream_offset=batch.start_of(start),
        first_line_no=batch.first_line_no + start,
        lines=batch.lines[start:stop],
        ends=batch.ends[start:stop],
        ranks=cut(batch.ranks),
        local_ranks=cut(batch.local_ranks),
        tasks=cut(batch.tasks),
        ts=cut(batch.ts),
    )


@dataclass(slots=True)
class Scan:
    """What a scan saw besides its events: the nodes, and where each event came from."""

    nodes: dict[str, Path] = field(default_factory=dict)
    """The job's nodes: hosts that lines name, and the node of each file that names none.

    A file whose lines name hosts adds its own node only when an event falls back to it, so
    that a merged file's name is never suspected as a node that stayed silent."""
    origins: dict[EventKey, Origin] = field(default_factory=dict)


class _HostRuns:
    """One file's batches cut into runs of lines of one node each (the host a line names,
    else the file's node), each fed to the scanner as that node's stream.

    A run is fed only when it holds a prefilter candidate, or when its node has had one:
    a block (a traceback) opens only on a candidate line, and may still be collecting the
    node's lines. The rest cannot produce an event, and skipping them keeps a file whose
    hosts alternate line by line from costing one scanner call per line.
    """

    __slots__ = ("_hosts", "_hot", "_log", "_prefilter", "namings")

    def __init__(self, log: NodeLog, ruleset: RuleSet) -> None:
        self._log = log
        self._prefilter = ruleset.prefilter
        self._hosts = LineHosts()
        self._hot: set[str] = set()
        self.namings: dict[str, str] = {}
        """Node -> how this file names it ("" for the file's own node)."""

    def parts(self, batch: LineBatch) -> list[tuple[str, LineBatch]]:
        log = self._log
        found = None if log.mapped else self._hosts.parse(batch.lines)
        if found is None:
            return [(log.node, batch)]
        candidates = sorted(self._prefilter.candidates(batch.lines))
        parts = []
        start = 0
        for node, run in groupby(host or log.node for host in found):
            stop = start + sum(1 for _ in run)
            if node not in self.namings:
                named = host_of(batch.lines[start], bool(self._hosts.pdsh))
                self.namings[node] = (
                    named[1] if named else (CONTINUATION if node != log.node else "")
                )
            first = bisect_left(candidates, start)
            if first < len(candidates) and candidates[first] < stop:
                self._hot.add(node)
            if node in self._hot:
                parts.append((node, _part(batch, start, stop)))
            start = stop
        return parts


def scan(
    logs: Sequence[NodeLog],
    ruleset: RuleSet,
    tails: list[NodeTail] | None = None,
    progress: Progress | None = None,
    seen: Scan | None = None,
    signals: SignalReader | None = None,
) -> list[RuleEvent]:
    """Rule events of every file; `tails` receives each file's last lines, `progress` sees
    every batch and `seen` learns nodes and origins, when given (the hang check needs the
    first two, the report the last); `signals` reads every batch's training numbers, its NaN
    losses and loss spikes joining the events."""
    scanner = JobScanner(ruleset)
    seen = seen if seen is not None else Scan()
    events: list[RuleEvent] = []
    for log in logs:
        last: deque[TailLine] = deque(maxlen=TAIL_LINES)
        runs = _HostRuns(log, ruleset)
        namings = runs.namings
        file_events: list[RuleEvent] = []
        with log.path.open("rb") as handle:
            for batch in frame_file(handle):
                batch_events: list[RuleEvent] = []
                for node, part in runs.parts(batch):
                    batch_events.extend(scanner.feed(node, None, part, 0.0))
                file_events.extend(batch_events)
                if signals is not None and (raised := signals.feed(log.node, None, batch, 0.0)):
                    file_events.extend(unexplained(raised, batch_events))
                if progress is not None:
                    progress.observe(batch)
                start = max(0, len(batch.lines) - TAIL_LINES)
                last.extend(
                    TailLine(batch.lines[i], batch.first_line_no + i, batch.start_of(i))
                    for i in range(start, len(batch.lines))
                )
        for node in dict.fromkeys([log.node, *namings]):
            file_events.extend(scanner.flush(node, None, 0.0))
        for node in namings:
            if node != log.node:
                seen.nodes.setdefault(node, log.path)
        if not any(namings.values()):
            seen.nodes.setdefault(log.node, log.path)  # a file of one node, named after it
        for event in file_events:
            naming = namings.get(event.node) or (MAP_NAMED if log.mapped else FILE_NAMED)
            seen.origins[_key(event)] = Origin(log.path, naming)
            seen.nodes.setdefault(event.node, log.path)
        events.extend(file_events)
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
    signal_config: SignalConfig | None = None,
) -> OfflineResult:
    tails: list[NodeTail] = []
    progress = Progress()
    seen = Scan()
    signals = SignalReader(signal_config or SignalConfig())
    events = scan(logs, ruleset, tails, progress, seen, signals)
    verdict = with_resume(correlate(events, ruleset, list(seen.nodes)), signals)
    if (
        verdict.status is Status.HEALTHY
        and stalled_for is not None
        and stalled_for >= hang_timeout
        and not finished(tails)
    ):
        verdict = hang_verdict(stalled_for, tails, progress.as_record(), action=hang_action)
    resume = signals.resume_from_step if verdict.failure_type in SIGNAL_TYPES else None
    return OfflineResult(
        verdict,
        seen.nodes,
        seen.origins,
        tuple(events),
        tuple(tails),
        progress.as_record(),
        resume_from_step=resume,
    )


async def consult(
    result: OfflineResult, settings: LlmSettings, job_id: str
) -> tuple[OfflineResult, str | None]:
    """The result with the LLM's vote applied, and why the LLM could not be asked, if so.

    Only an unresolved result with something to show is asked. An endpoint that cannot be
    reached leaves the result as the rules made it; a prompt template or redaction pattern
    that fails raises, for the caller to report.
    """
    # Imported here: a rules-only run (no LLM configured) need not load the openai client.
    from diagnoser.llm.client import LlmClient
    from diagnoser.llm.prompt import Prompts
    from diagnoser.llm.redaction import Redactor
    from diagnoser.llm.sampling import ask, vote_record

    if not result.unresolved or not settings.enabled:
        return result, None
    trace = result.trace(job_id).redacted(Redactor(settings.redact_patterns))
    if not trace.lines:
        return result, None
    messages = Prompts(settings.prompts_dir).diagnose(
        job_id, trace.lines, version=settings.prompt_version
    )
    client = LlmClient(settings)
    try:
        asked = await ask(
            client,
            messages,
            trace.checkable,
            k=settings.samples,
            min_agreement=settings.min_agreement,
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
        )
    finally:
        await client.aclose()
    if not asked.reached:
        return result, asked.failure
    return result.with_llm(vote_record(asked, trace.lines, settings)), None
