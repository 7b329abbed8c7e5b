"""Scan one job's log streams with a compiled RuleSet, one pass per line.

Only lines the prefilter flags are touched in Python, except while a multi-line block is open
on the stream, when following lines are offered to its assembler until it closes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

import regex

from diagnoser.ingest.framing import LineBatch
from diagnoser.rules.assembly import (
    TRIGGER_ORDER,
    Assembler,
    Block,
    ChildFailedAssembler,
    TracebackAssembler,
    Verdict,
    cpp_backtrace_line,
    headless_exception,
    open_block,
    strip_prefix,
    warning_level,
)
from diagnoser.rules.events import RuleEvent
from diagnoser.rules.schema import EXCEPTION_TEMPLATE, Unit
from diagnoser.rules.window import WindowState

if TYPE_CHECKING:
    from diagnoser.rules.ruleset import CompiledRule, RuleSet

_TIMESTAMP = regex.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6})\d*)?\s?(Z|[+-]\d{2}:?\d{2})?"
)

StreamKey = tuple[str, int | None]


def parse_time(line: str) -> float | None:
    """Epoch seconds of an ISO-8601 timestamp near the start of the line (UTC if no zone)."""
    m = _TIMESTAMP.search(line, 0, 64)
    if m is None:
        return None
    date, clock, fraction, zone = m.groups()
    text = f"{date}T{clock}" + (f".{fraction:0<6}" if fraction else "")
    zone = "+00:00" if zone in (None, "Z") else zone
    try:
        return datetime.fromisoformat(text + zone).timestamp()
    except ValueError:
        return None


class JobScanner:
    """Stateful scanner for one job: per-stream block assembly, job-wide windows.

    A stream is (node, rank); `rank` is None for a stream carrying several ranks (per-line ranks
    then come from `LineBatch.ranks`). Not thread-safe: one job's batches arrive in order.
    """

    def __init__(self, ruleset: RuleSet) -> None:
        self.ruleset = ruleset
        self._open: dict[StreamKey, dict[int | None, Assembler]] = {}
        self._windows = WindowState()
        self._rule_mask = (1 << len(ruleset.rules)) - 1
        self._fallback_line_mask = sum(
            1 << rule.index
            for rule in ruleset.rules
            if rule.spec.fallback and rule.spec.unit is Unit.LINE
        )
        self.timeouts: dict[str, int] = {}
        """Regex runs abandoned after `RuleSet.timeout`, per rule id."""
        self._tails: dict[StreamKey, str] = {}
        """Each stream's last line so far: the line before its next batch's first."""
        self._before: str | None = None
        """The line before the batch being scanned, on its stream."""
        self._warned: dict[StreamKey, int] = {}
        """Per stream, the number of the last line of a C++ backtrace a warning carries."""

    def feed(self, node: str, rank: int | None, batch: LineBatch, now: float) -> list[RuleEvent]:
        """Scan one batch of a stream; return the events it completes, in line order."""
        candidates = self.ruleset.prefilter.candidates(batch.lines)
        key = (node, rank)
        blocks = self._open.get(key)
        out: list[RuleEvent] = []
        self._before = self._tails.get(key)
        if batch.lines:
            self._tails[key] = batch.lines[-1]
        if not candidates and not blocks:
            return out
        if blocks is None:
            blocks = self._open[key] = {}
        order = list(candidates)
        next_candidate = 0
        pos = 0
        total = len(batch.lines)
        while True:
            if blocks:
                if pos >= total:
                    break
                index = pos
            else:
                while next_candidate < len(order) and order[next_candidate] < pos:
                    next_candidate += 1
                if next_candidate >= len(order):
                    break
                index = order[next_candidate]
            self._line(node, rank, batch, index, candidates.get(index, 0), blocks, now, out)
            pos = index + 1
        if not blocks:
            del self._open[key]
        return out

    def flush(self, node: str, rank: int | None, now: float) -> list[RuleEvent]:
        """End of a stream: close its open blocks. A traceback that never reached its exception
        line is read by the catch-all line rules instead (`_orphaned`)."""
        out: list[RuleEvent] = []
        self._tails.pop((node, rank), None)
        self._warned.pop((node, rank), None)
        for line_rank, assembler in self._open.pop((node, rank), {}).items():
            block = assembler.finish()
            if block is not None:
                out.extend(self._block_events(block, node, line_rank, now))
            else:
                out.extend(self._orphaned(assembler, node, line_rank, now))
        return out

    def _orphaned(
        self, assembler: Assembler, node: str, rank: int | None, now: float
    ) -> list[RuleEvent]:
        """A traceback given up without its exception line (the stream ended, another header
        came, other output buried it): its lines are no unit's evidence any more, so the
        fallback line rules read them, frames first (they say where), the header last (a
        header nothing followed still says that something raised), and the first that speaks
        is kept. A log cut after `Traceback (most recent call last):` is not a healthy log.
        The same holds for a `ChildFailedError` header whose "Root Cause" section never came,
        header first: its own fallback rule names the failure, and only the catch-alls read
        these lines (rules with a cause read them as they came), so any that speaks says as
        much; reading the up to 200 lines it took in first cost half the scanner's rate on
        failure-heavy streams (`bench/rules.py`)."""
        lines: tuple[str, ...]
        if isinstance(assembler, TracebackAssembler):
            if assembler.exception is not None:
                return []
            lines = (*assembler.lines[1:], *assembler.lines[:1])
        elif isinstance(assembler, ChildFailedAssembler) and not assembler.fields:
            lines = tuple(assembler.lines)
        else:
            return []
        for line in lines:
            events = self._line_events(
                self._fallback_line_mask,
                line,
                assembler.offset,
                assembler.line_no,
                node,
                rank,
                now,
            )
            if events:
                return events
        return []

    def flush_all(self, now: float) -> list[RuleEvent]:
        out: list[RuleEvent] = []
        for node, rank in list(self._open):
            out.extend(self.flush(node, rank, now))
        return out

    def _line(
        self,
        node: str,
        stream_rank: int | None,
        batch: LineBatch,
        index: int,
        mask: int,
        blocks: dict[int | None, Assembler],
        now: float,
        out: list[RuleEvent],
    ) -> None:
        line = batch.lines[index]
        ranks = batch.ranks
        rank = stream_rank
        if ranks is not None and ranks[index] is not None:
            rank = ranks[index]
        offset = batch.start_of(index)
        line_no = batch.first_line_no + index
        cri = batch.ts[index] if batch.ts is not None else None
        if cri is not None:
            # The container runtime's receive time beats anything parsed from the text.
            now = -cri / 1e9
        closed: Block | None = None
        verdict: Verdict | None = None
        assembler = blocks.get(rank)
        if assembler is not None:
            verdict = assembler.offer(line, offset, line_no)
            if verdict is not Verdict.CONTINUE:
                del blocks[rank]
                if verdict is not Verdict.ABANDON:
                    closed = assembler.finish()
                if closed is None:
                    out.extend(self._orphaned(assembler, node, rank, now))
            if closed is not None and verdict is Verdict.CLOSE_WITHOUT:
                out.extend(self._block_events(closed, node, rank, now))
                closed = None

        if (
            closed is None
            and verdict not in (Verdict.CONTINUE, Verdict.CLOSE_WITH)
            and mask & self.ruleset.headless_bit
            and not mask & self.ruleset.trigger_mask
        ):
            closed = headless_exception(line, offset, line_no)

        # A line an open multi-line unit took in (a traceback's frame) is that unit's
        # evidence: catch-all line rules stay out of it. So is the header that opens a
        # traceback or a ChildFailedError report: if the unit is never completed, `_orphaned`
        # gives it back to them.
        opens_unit = verdict is not Verdict.CONTINUE and bool(
            mask
            & (
                self.ruleset.trigger_bits[Unit.TRACEBACK]
                | self.ruleset.trigger_bits[Unit.CHILD_FAILED]
            )
        )
        inside = verdict is Verdict.CONTINUE or opens_unit
        if (
            not inside
            and mask & self._fallback_line_mask
            and ("frame #" in line or "Exception raised from " in line)
        ):
            inside = self._carried_by_warning((node, stream_rank), batch, index, line, line_no)
        events = self._line_events(mask, line, offset, line_no, node, rank, now, not inside)
        preceding: tuple[str, ...] = ()
        if closed is not None and closed.unit is not Unit.TRACEBACK:
            out.extend(self._block_events(closed, node, rank, now))
        elif closed is not None:
            if events:
                # The exception line was classified by a line rule: frames become its evidence.
                events = [_with_evidence(e, closed.evidence) for e in events]
            elif mask & (self.ruleset.trigger_mask & ~self.ruleset.trigger_bits[Unit.TRACEBACK]):
                # The exception line opens a richer block (NCCL error, ChildFailedError).
                preceding = closed.evidence
            else:
                out.extend(self._block_events(closed, node, rank, now))
        out.extend(events)

        if mask & self.ruleset.trigger_mask and verdict is not Verdict.CONTINUE:
            for unit in TRIGGER_ORDER:
                if mask & self.ruleset.trigger_bits[unit]:
                    blocks[rank] = open_block(unit, line, offset, line_no, preceding)
                    break

    def _carried_by_warning(
        self, key: StreamKey, batch: LineBatch, index: int, line: str, line_no: int
    ) -> bool:
        """Whether the line is part of a C++ backtrace a warning-level line carries.

        c10's loggers print a caught c10::Error's `what()` in one message, and `what()` ends
        with the error's backtrace ("Exception raised from <fn> at <file> (most recent call
        first):", then `frame #N:` lines), so a warning about a handled error (c10d's TCPStore
        client warning, ProcessGroupNCCL's heartbeat monitor at teardown) is followed by
        lines that look like an orphan native backtrace. A backtrace whose header directly
        follows a warning-level line (`[W...]`), and its frames after it without a gap, are that
        warning's text: the rules that read the warning decide, catch-alls stay out. A backtrace
        after an error-level line, an exception line, `what():`, or nothing keeps its reading.
        Only lines already flagged for a catch-all get here, and the test is literal first.
        """
        kind = cpp_backtrace_line(line)
        if kind == 0:
            return False
        if kind == 2:
            carried = self._warned.get(key) == line_no - 1
        else:
            before = batch.lines[index - 1] if index else self._before
            carried = before is not None and warning_level(before)
        if carried:
            self._warned[key] = line_no
        return carried

    def _line_events(
        self,
        mask: int,
        line: str,
        offset: int,
        line_no: int,
        node: str,
        rank: int | None,
        now: float,
        fallbacks_too: bool = True,
    ) -> list[RuleEvent]:
        bits = mask & self._rule_mask
        events: list[RuleEvent] = []
        if not bits:
            return events
        rules = self.ruleset.rules
        fallbacks: list[CompiledRule] = []
        matched = False
        # A pattern anchored at the start of a message (`^RuntimeError: Socket Timeout`) also
        # reads it past a launcher's prefix (`[1,3]<stderr>:`, srun's `3: `, `[rank3]: `).
        body = strip_prefix(line)
        while bits:
            low = bits & -bits
            bits ^= low
            rule = rules[low.bit_length() - 1]
            if rule.spec.fallback:
                fallbacks.append(rule)
                continue
            m = self._search_line(rule, line, body)
            if m is not None:
                event = self._event(rule, m, line, offset, line_no, node, rank, now, {}, ())
                if event is not None:
                    matched = True
                    events.append(event)
        # A windowed rule that matched without reaching its count did not fire: the line's
        # catch-all still speaks (a lone bus error escalates while it waits for its NCCL frame).
        if not matched and fallbacks_too:
            for rule in fallbacks:
                m = self._search_line(rule, line, body)
                if m is not None:
                    event = self._event(rule, m, line, offset, line_no, node, rank, now, {}, ())
                    if event is not None:
                        events.append(event)
        return events

    def _block_events(
        self, block: Block, node: str, rank: int | None, now: float
    ) -> list[RuleEvent]:
        rules = self.ruleset.block_rules[block.unit]
        if block.unit is Unit.CHILD_FAILED and "rank" in block.entities:
            rank = int(block.entities["rank"])
        events: list[RuleEvent] = []
        context: str | None = None
        headless = "headless" in block.entities
        for fallback in (False, True):
            if fallback and events:
                break
            for rule in rules:
                if rule.spec.fallback is not fallback:
                    continue
                if fallback and headless and not rule.spec.headless:
                    # Without its traceback, an exception line counts for a specific rule, or
                    # for a catch-all written for it (one that lets `ConnectionError: retrying
                    # in 5s` from a healthy run pass).
                    continue
                m = self._search(rule, block.text)
                if m is None:
                    continue
                if rule.requires:
                    context = context if context is not None else "\n".join(block.lines)
                    if not all(self._search(rule, context, p) for p in rule.requires):
                        continue
                event = self._event(
                    rule, m, block.text, block.offset, block.line_no, node, rank, now,
                    block.entities, block.evidence,
                )  # fmt: skip
                if event is not None:
                    events.append(event)
        return events

    def _search_line(self, rule: CompiledRule, line: str, body: str) -> regex.Match[str] | None:
        m = self._search(rule, line)
        if m is None and body is not line:
            m = self._search(rule, body)
        return m

    def _search(
        self, rule: CompiledRule, text: str, only: regex.Pattern[str] | None = None
    ) -> regex.Match[str] | None:
        for pattern in (only,) if only is not None else rule.patterns:
            try:
                m = pattern.search(text, timeout=self.ruleset.timeout)
            except TimeoutError:
                self.timeouts[rule.id] = self.timeouts.get(rule.id, 0) + 1
                continue
            if m is not None:
                return m
        return None

    def _event(
        self,
        rule: CompiledRule,
        m: regex.Match[str],
        text: str,
        offset: int,
        line_no: int,
        node: str,
        rank: int | None,
        now: float,
        base: dict[str, str],
        evidence: tuple[str, ...],
    ) -> RuleEvent | None:
        spec = rule.spec
        entities = dict(base)
        entities.update({k: v for k, v in m.groupdict().items() if v is not None})
        if rank is None and entities.get("rank", "").isdigit():
            rank = int(entities["rank"])
        # A negative `now` is an exact time from the runtime (see `_line`): no parsing needed.
        t = -now if now < 0 else parse_time(text) or now
        if spec.window is not None:
            window = spec.window
            fields = {**entities, "node": node, "rank": "" if rank is None else str(rank)}
            key = tuple(fields.get(name, "") for name in window.same)
            value = fields.get(window.distinct, "") if window.distinct else ""
            count = self._windows.hit(spec.id, window, key, value, t)
            if not count:
                return None
            entities["window_count"] = str(count)
        failure_type = spec.failure_type
        if failure_type == EXCEPTION_TEMPLATE:
            failure_type = entities.get("exception", "Exception")
        action = spec.action
        if spec.action_from is not None:
            stated = entities.get(spec.action_from, "").strip().casefold()
            action = next(
                (a for k, a in spec.action_map.items() if k.casefold() == stated), spec.action
            )
        return RuleEvent(
            rule_id=spec.id,
            failure_type=failure_type,
            category=spec.category,
            action=action,
            severity=spec.severity,
            scope=spec.scope,
            entities=entities,
            text=text,
            offset=offset,
            line_no=line_no,
            node=node,
            rank=rank,
            time=t,
            evidence=evidence,
        )


def _with_evidence(event: RuleEvent, evidence: tuple[str, ...]) -> RuleEvent:
    return replace(event, evidence=evidence)
