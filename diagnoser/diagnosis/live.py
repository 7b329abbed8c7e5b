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
from diagnoser.rules import Action, JobScanner, RuleEvent, RuleRegistry, RuleSet

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
    lifecycle: hang.Lifecycle | None = None
    """Lifecycle events seen here, or loaded from the database; None: not known yet."""
    lifecycle_loaded_at: float | None = None
    """When `lifecycle` was read from the database (None: built from events posted here)."""
    hung_since: float | None = None
    """The stall a stored hang diagnosis describes (its `since`); None when not hung."""
    checked_since: float | None = None
    """A stall already found not to be a hang (job not running, or finished): skip it."""
    resumed: bool = False
    """Progress came back after a reported hang; the flow resolves that diagnosis."""

    @property
    def since(self) -> float:
        """Where the current stall starts: the last step, or the last line for a job without."""
        return self.last_step_at if self.last_step_at is not None else self.last_line_at

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
        hang_action: Action = hang.DEFAULT_ACTION,
    ) -> None:
        self.registry = registry
        self.hang_action = hang_action
        """What a hang without a known cause recommends (`DIAGNOSER_HANG__ACTION`)."""
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
        events = state.scanner.feed(key.node, key.rank, batch, now)
        if events:
            state.add(events)
            self.events_by_rule.update(event.rule_id for event in events)

    def _observe_time(
        self, state: JobState, node: str, batch: LineBatch, now: float, step: int | None
    ) -> None:
        state.last_line_at = state.node_last_at[node] = now
        advanced = state.progress.last_step != step
        if advanced:
            if state.last_step_at is not None and state.hung_since is None:
                # A hang's own length is not a step interval: it would stretch the next window.
                state.step_intervals.append(now - state.last_step_at)
            state.last_step_at = now
        tail = state.tails.get(node)
        if tail is None:
            tail = state.tails[node] = deque(maxlen=TAIL_LINES)
        lines = batch.lines
        for i in range(max(0, len(lines) - TAIL_LINES), len(lines)):
            text = lines[i][:TAIL_LINE_CHARS]
            tail.append(hang.TailLine(text, batch.first_line_no + i, batch.start_of(i)))
        if state.hung_since is not None and (advanced or state.last_step_at is None):
            # Steps advance again (or, for a job that never reported steps, lines flow again).
            state.hung_since = None
            state.resumed = True

    def record_lifecycle(self, job_id: str, event: hang.LifecycleEvent) -> None:
        """A launcher's `started` / `heartbeat` / `exited`, as posted to this replica.

        A restart (`Lifecycle.is_restart`) begins a new attempt: the live state starts over, so
        the old attempt's failure no longer blocks hang checks and redone steps count as
        progress. The flow settles the old attempt first (`DiagnosisFlow.lifecycle`).
        """
        state = self._job(job_id)
        lifecycle = state.lifecycle or hang.Lifecycle()
        if lifecycle.is_restart(event) and state.last_line_at:
            loaded_at = state.lifecycle_loaded_at
            ruleset = self.registry.active
            state = self.jobs[job_id] = JobState(ruleset, JobScanner(ruleset))
            state.lifecycle_loaded_at = loaded_at
        lifecycle.record(event)
        state.lifecycle = lifecycle
        state.checked_since = None

    def is_restart(self, job_id: str, event: hang.LifecycleEvent) -> bool:
        state = self.jobs.get(job_id)
        if state is None or not state.last_line_at:
            return False
        return (state.lifecycle or hang.Lifecycle()).is_restart(event)

    def tracks(self, job_id: str) -> bool:
        """The job has live state here (it sent logs or events to this process)."""
        return job_id in self.jobs

    def unsettled(self, job_id: str) -> bool:
        """Events scanned that the flow has not turned into a verdict yet."""
        state = self.jobs.get(job_id)
        return state is not None and state.dirty

    def needs_lifecycle(self, job_id: str, window_s: float) -> bool:
        """True when the database must be asked whether the job is running: never read yet, or
        read more than a window ago (events may have gone to another replica since)."""
        state = self.jobs.get(job_id)
        if state is None:
            return False
        loaded = state.lifecycle_loaded_at
        return loaded is None or self.clock() - loaded >= window_s

    def load_lifecycle(self, job_id: str, events: list[hang.LifecycleEvent]) -> None:
        """Merge lifecycle events read from the database (posted to another replica, or before
        this one restarted) with those seen here."""
        state = self.jobs.get(job_id)
        if state is None:
            return
        lifecycle = state.lifecycle or hang.Lifecycle()
        for event in events:
            lifecycle.record(event)
        state.lifecycle = lifecycle
        state.lifecycle_loaded_at = self.clock()

    def take_resumed(self, job_id: str) -> bool:
        """True once after a hung job made progress again."""
        state = self.jobs.get(job_id)
        if state is None or not state.resumed:
            return False
        state.resumed = False
        return True

    def stall_candidates(self, timeout_s: float) -> list[tuple[str, float]]:
        """(job, window) for every job whose stall has outlasted its window and that nothing
        else explains yet: no failure, no unsettled events, not reported already, and not
        already found not to be a hang (job not running, or finished)."""
        now = self.clock()
        found = []
        for job_id, state in self.jobs.items():
            if state.failing or state.dirty or state.hung_since is not None:
                continue
            if not state.last_line_at or state.checked_since == state.since:
                continue
            window_s = hang.window(timeout_s, state.step_intervals)
            if now - state.since >= window_s:
                found.append((job_id, window_s))
        return found

    def hang(self, job_id: str, window_s: float) -> tuple[Verdict, RuleSet, float] | None:
        """The job's hang verdict, if it is running and its logs do not say it finished; also
        the `since` to pass to `mark_hung`. A stall that is not a hang is not asked about again
        until the job writes or its launcher reports."""
        state = self.jobs.get(job_id)
        if state is None or state.failing or state.dirty or state.hung_since is not None:
            return None
        now = self.clock()
        lifecycle = state.lifecycle or hang.Lifecycle()
        tails = [
            hang.NodeTail(node, tuple(lines), state.node_last_at.get(node, 0.0))
            for node, lines in sorted(state.tails.items())
        ]
        if not lifecycle.running(now, window_s, state.nodes) or hang.finished(tails):
            state.checked_since = state.since
            return None
        verdict = hang.hang_verdict(
            now - state.since,
            tails,
            state.progress.as_record(),
            hang.silent_nodes(tails, now, window_s),
            lifecycle.failed_nodes(),
            self.hang_action,
        )
        return verdict, state.ruleset, state.since

    def mark_hung(self, job_id: str, since: float, verdict: Verdict) -> bool | None:
        """The hang diagnosis for the stall starting at `since` is stored. False when the job
        made progress meanwhile (the caller resolves it at once); None when the job's live
        state is gone (evicted or restarted): nothing is known either way."""
        state = self.jobs.get(job_id)
        if state is None:
            return None
        if state.since != since:
            return False
        state.hung_since = since
        state.last = verdict_key(verdict)
        return True

    def flag_resumed(self, job_id: str) -> None:
        """A resolve that failed to store: try again at the next settle."""
        state = self.jobs.get(job_id)
        if state is not None:
            state.resumed = True

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
