"""The live diagnosis stage: rule scanning per job as lines arrive, verdicts on demand.

It sits in the ingest pipeline, so it only scans and remembers (in memory, bounded); turning a
changed verdict into a stored diagnosis is the flow's job, after the lines are committed.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnoser.diagnosis import hang
from diagnoser.diagnosis.correlate import Status, Verdict, correlate
from diagnoser.diagnosis.progress import Progress
from diagnoser.ingest.framing import LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules import JobScanner, RuleEvent, RuleRegistry, RuleSet

MAX_EVENTS_PER_JOB = 2000
MAX_JOBS = 10_000
TAIL_LINES = 5
TAIL_LINE_CHARS = 2048
"""Tail lines kept for hang evidence are cut here: 10,000 jobs x nodes x 5 stays bounded."""
STEP_INTERVALS = 16


def verdict_key(verdict: Verdict) -> tuple[object, ...]:
    """What makes two verdicts the same diagnosis to an on-call engineer."""
    return (
        verdict.status,
        verdict.action,
        verdict.failure_type,
        verdict.culprit_nodes,
        verdict.rule_ids,
        verdict.affected_ranks,
    )


@dataclass
class JobState:
    ruleset: RuleSet
    scanner: JobScanner
    events: dict[tuple[str, str, int | None], RuleEvent] = field(default_factory=dict)
    """First event per (rule, node, rank): repeats of a line add nothing to a diagnosis."""
    progress: Progress = field(default_factory=Progress)
    nodes: set[str] = field(default_factory=set)
    dirty: bool = False
    last: tuple[object, ...] | None = None
    failing: bool = False
    """The current verdict is a failure or an escalation: that, not a stall, explains a stop."""
    last_line_at: float = 0.0
    last_step_at: float | None = None
    """When the step counter last advanced (None until the job reports steps)."""
    step_intervals: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_INTERVALS))
    tails: dict[str, deque[hang.TailLine]] = field(default_factory=dict)
    node_last_at: dict[str, float] = field(default_factory=dict)
    exited: bool = False
    hung: bool = False
    """A hang was reported and no progress has been seen since."""
    resumed: bool = False
    """Progress came back after a reported hang; the flow resolves that diagnosis."""

    def add(self, events: list[RuleEvent]) -> None:
        for event in events:
            key = (event.rule_id, event.node, event.rank)
            if key not in self.events and len(self.events) < MAX_EVENTS_PER_JOB:
                self.events[key] = event
                self.dirty = True


class DiagnosisStage:
    """Per-job scanners, least recently active evicted past `max_jobs`."""

    def __init__(
        self,
        registry: RuleRegistry,
        *,
        clock: Callable[[], float] = time.time,
        max_jobs: int = MAX_JOBS,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.max_jobs = max_jobs
        self.jobs: OrderedDict[str, JobState] = OrderedDict()
        self.events_by_rule: Counter[str] = Counter()
        """Every rule match, repeats included (bounded by the number of rules)."""

    def _job(self, job_id: str) -> JobState:
        state = self.jobs.get(job_id)
        if state is None:
            ruleset = self.registry.active  # a job keeps the rule set it started with
            state = self.jobs[job_id] = JobState(ruleset, JobScanner(ruleset))
            while len(self.jobs) > self.max_jobs:
                self.jobs.popitem(last=False)
        else:
            self.jobs.move_to_end(job_id)
        return state

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        state = self._job(key.job_id)
        now = self.clock()
        step = state.progress.last_step
        state.progress.observe(batch)
        state.nodes.add(key.node)
        if batch.lines:
            self._observe_time(state, key.node, batch, now, step)
        events = state.scanner.feed(key.node, key.rank, batch, self.clock())
        if events:
            state.add(events)
            self.events_by_rule.update(event.rule_id for event in events)

    def _observe_time(
        self, state: JobState, node: str, batch: LineBatch, now: float, step: int | None
    ) -> None:
        state.last_line_at = state.node_last_at[node] = now
        if state.progress.last_step != step:
            if state.last_step_at is not None:
                state.step_intervals.append(now - state.last_step_at)
            state.last_step_at = now
        tail = state.tails.get(node)
        if tail is None:
            tail = state.tails[node] = deque(maxlen=TAIL_LINES)
        lines = batch.lines
        for i in range(max(0, len(lines) - TAIL_LINES), len(lines)):
            text = lines[i][:TAIL_LINE_CHARS]
            tail.append(hang.TailLine(text, batch.first_line_no + i, batch.start_of(i)))
        if state.hung and (state.last_step_at == now or state.progress.last_step is None):
            # Steps advance again (or, for a job that never reported steps, lines flow again).
            state.hung = False
            state.resumed = True

    def lifecycle(self, job_id: str, *, running: bool) -> None:
        """The launcher reported an exit (silence from now on is not a hang) or a (re)start."""
        state = self.jobs.get(job_id)
        if state is not None:
            state.exited = not running

    def take_resumed(self, job_id: str) -> bool:
        """True once after a hung job made progress again."""
        state = self.jobs.get(job_id)
        if state is None or not state.resumed:
            return False
        state.resumed = False
        return True

    def stalled(self, timeout_s: float) -> list[tuple[str, Verdict, RuleSet]]:
        """Jobs stalled past their window with nothing else to explain it, as hang verdicts.

        Each is reported once; it is reported again only after it made progress and stalled anew.
        """
        now = self.clock()
        found: list[tuple[str, Verdict, RuleSet]] = []
        for job_id, state in self.jobs.items():
            if state.exited or state.hung or state.failing or not state.last_line_at:
                continue
            since = state.last_step_at if state.last_step_at is not None else state.last_line_at
            stalled_for = now - since
            window_s = hang.window(timeout_s, state.step_intervals)
            if stalled_for < window_s:
                continue
            tails = [
                hang.NodeTail(node, tuple(lines), state.node_last_at.get(node, 0.0))
                for node, lines in sorted(state.tails.items())
            ]
            if hang.finished(tails):
                continue
            silent = hang.silent_nodes(tails, now, window_s)
            verdict = hang.hang_verdict(stalled_for, tails, state.progress.as_record(), silent)
            state.hung = True
            state.last = verdict_key(verdict)
            found.append((job_id, verdict, state.ruleset))
        return found

    def progress(self, job_id: str) -> dict[str, int] | None:
        state = self.jobs.get(job_id)
        return state.progress.as_record() if state is not None else None

    def changed_verdict(self, job_id: str) -> tuple[Verdict, RuleSet] | None:
        """The job's verdict if new evidence changed it since the last call, else None."""
        state = self.jobs.get(job_id)
        if state is None or not state.dirty:
            return None
        state.dirty = False
        verdict = correlate(list(state.events.values()), state.ruleset, state.nodes)
        state.failing = verdict.status is not Status.HEALTHY
        key = verdict_key(verdict)
        if key == state.last:
            return None
        state.last = key
        return verdict, state.ruleset
