"""The trace an LLM sees for a failure no rule explains: small, ordered, and honest about nodes.

It is built from what the live stage already keeps (rule events with their context lines, each
node's tail, exit events, progress), in this order of worth: the earliest failure line, the
other failure lines, exits and progress, the context before failure lines, the tails. Lines are
taken in that order until the character budget is spent, so the least informative go first and
the earliest error never does; the survivors are then put back in log order and numbered.

Storm collapse: lines that are the same once numbers are masked (1,024 ranks printing one NCCL
timeout) become one line with a count. A collapsed line seen on several nodes is attributed to
no single node (`MANY_NODES`), so citing it can never justify cordoning one of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import regex

from diagnoser.diagnosis.hang import LifecycleEvent, NodeTail
from diagnoser.llm.answer import TraceLines
from diagnoser.llm.prompt import PromptLine
from diagnoser.llm.redaction import Redactor
from diagnoser.rules import RuleEvent

DEFAULT_BUDGET_CHARS = 12_000
"""About 3,000 tokens of log: room for the instructions and k answers in an 8k context."""
MAX_LINE_CHARS = 600
CONTEXT_PER_EVENT = 3
MAX_EVENTS = 40
MANY_NODES = "(several nodes)"
LAUNCHER = "(launcher)"

VARIABLE = regex.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8,}\b|\d+(?:\.\d+)?")


def masked(text: str) -> str:
    """The line with its numbers and hex ids replaced: what stays the same across ranks."""
    return VARIABLE.sub("<n>", text)


@dataclass(frozen=True, slots=True)
class Trace:
    job_id: str
    lines: tuple[PromptLine, ...]
    nodes: frozenset[str]
    dropped: int
    """Lines left out for the budget."""

    @property
    def checkable(self) -> TraceLines:
        return TraceLines(
            node_of_line={line.number: line.node for line in self.lines},
            job_nodes=self.nodes,
            flagged=frozenset(line.number for line in self.lines if line.flagged),
        )

    def fingerprint(self, model: str, prompt_version: str) -> str:
        """Same masked trace, same model, same prompt: the same question, asked once."""
        digest = hashlib.sha256(f"{model}\n{prompt_version}\n".encode())
        for line in self.lines:
            digest.update(f"{line.node}\t{masked(line.text)}\n".encode())
        return digest.hexdigest()

    def redacted(self, redactor: Redactor) -> Trace:
        """The trace as it may leave the process: every line's secrets replaced."""
        lines = tuple(
            PromptLine(
                ln.number, ln.node, ln.rank, redactor.redact(ln.text).text, ln.count, ln.flagged
            )
            for ln in self.lines
        )
        return Trace(self.job_id, lines, self.nodes, self.dropped)

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "nodes": sorted(self.nodes),
            "dropped": self.dropped,
            "lines": [
                {
                    "number": ln.number,
                    "node": ln.node,
                    "rank": ln.rank,
                    "text": ln.text,
                    "count": ln.count,
                    "flagged": ln.flagged,
                }
                for ln in self.lines
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Trace:
        raw_lines = data.get("lines")
        raw_nodes = data.get("nodes")
        lines = tuple(
            PromptLine(
                number=int(item["number"]),
                node=str(item["node"]),
                rank=None if item.get("rank") is None else int(item["rank"]),
                text=str(item["text"]),
                count=int(item.get("count", 1)),
                flagged=item.get("flagged") is True,
            )
            for item in (raw_lines if isinstance(raw_lines, list) else [])
            if isinstance(item, dict)
        )
        nodes = frozenset(str(n) for n in (raw_nodes if isinstance(raw_nodes, list) else []))
        dropped = data.get("dropped")
        return cls(
            str(data.get("job_id", "")), lines, nodes, dropped if isinstance(dropped, int) else 0
        )


@dataclass(slots=True)
class _Candidate:
    tier: int
    order: tuple[float, int, int]
    node: str
    rank: int | None
    text: str
    count: int = 1
    nodes: frozenset[str] = frozenset()
    """The nodes whose own line this is (a collapsed storm: all of them)."""


def assemble(
    job_id: str,
    events: Sequence[RuleEvent],
    tails: Sequence[NodeTail] = (),
    exits: Sequence[LifecycleEvent] = (),
    progress: Mapping[str, int] | None = None,
    nodes: frozenset[str] = frozenset(),
    budget_chars: int = DEFAULT_BUDGET_CHARS,
) -> Trace:
    event_lines = _event_lines(events)
    shown = {(events_node, c.order[1], c.text) for c in event_lines for events_node in c.nodes}
    fresh_tails = [
        c for c in _tail_lines(tails) if (c.node, c.order[1], c.text) not in shown
    ]  # a node's last line that is its failure line already is not shown twice
    candidates = event_lines + _exit_lines(exits) + fresh_tails
    if progress:
        text = ", ".join(f"{key} {value}" for key, value in sorted(progress.items()))
        candidates.append(_Candidate(2, (float("inf"), 0, 0), LAUNCHER, None, f"progress: {text}"))
    kept: list[_Candidate] = []
    spent = 0
    for candidate in sorted(candidates, key=lambda c: (c.tier, c.order)):
        cost = len(candidate.text) + 40
        if kept and spent + cost > budget_chars:
            continue
        kept.append(candidate)
        spent += cost
    kept.sort(key=lambda c: c.order)
    lines = tuple(
        PromptLine(number, c.node, c.rank, c.text, c.count, c.tier <= 1)
        for number, c in enumerate(kept, 1)
    )
    all_nodes = nodes | {e.node for e in events} | {t.node for t in tails}
    all_nodes |= {e.node for e in exits if e.node}
    return Trace(job_id, lines, frozenset(all_nodes), len(candidates) - len(kept))


def _event_lines(events: Sequence[RuleEvent]) -> list[_Candidate]:
    """Failure lines, storms collapsed first (so a count covers every rank), then capped."""
    groups: dict[str, list[RuleEvent]] = {}
    for event in sorted(events, key=lambda e: (e.time, e.line_no)):
        groups.setdefault(masked(event.text), []).append(event)
    out: list[_Candidate] = []
    for index, members in enumerate(list(groups.values())[:MAX_EVENTS]):
        first = members[0]
        nodes = {m.node for m in members}
        ranks = {m.rank for m in members}
        context = first.evidence[-CONTEXT_PER_EVENT:]
        for back, text in enumerate(context):
            order = (first.time, first.line_no - len(context) + back, back)
            out.append(
                _Candidate(3, order, first.node, first.rank, _cut(text), 1, frozenset({first.node}))
            )
        out.append(
            _Candidate(
                0 if index == 0 else 1,
                (first.time, first.line_no, len(context)),
                first.node if len(nodes) == 1 else MANY_NODES,
                first.rank if len(ranks) == 1 else None,
                _cut(first.text),
                len(members),
                frozenset(nodes),
            )
        )
    return out


def _exit_lines(exits: Sequence[LifecycleEvent]) -> list[_Candidate]:
    out = []
    for event in exits:
        if event.kind != "exited" or (event.exit_code in (0, None) and event.signal is None):
            continue
        how = f"signal {event.signal}" if event.signal else f"exit code {event.exit_code}"
        out.append(
            _Candidate(
                2, (event.at, 0, 0), event.node or LAUNCHER, None, f"process exited with {how}"
            )
        )
    return out


def _tail_lines(tails: Sequence[NodeTail]) -> list[_Candidate]:
    return [
        _Candidate(4, (tail.last_at, line.line_no, 0), tail.node, None, _cut(line.text))
        for tail in tails
        for line in tail.lines
    ]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + " [...]"
