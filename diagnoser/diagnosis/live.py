"""The live diagnosis stage: rule scanning per job as lines arrive, verdicts on demand.

It sits in the ingest pipeline, so it only scans and remembers (in memory, bounded); turning a
changed verdict into a stored diagnosis is the flow's job, after the lines are committed.

Memory is not the record: a job's live state is gone after a service restart or an eviction,
and the flow then hands the stored diagnosis's evidence back (`absorb`) before it updates it.
Eviction goes by what it would lose (`JobState.keep`): a flood of new one-batch jobs evicts its
own kind first, then jobs whose failure is stored (their evidence comes back), then established
quiet jobs (their progress and tails, which hang detection needs, would not), and jobs with
something not yet stored only when every job has that.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from diagnoser.diagnosis import hang
from diagnoser.diagnosis.correlate import Status, Verdict, correlate
from diagnoser.diagnosis.progress import Progress
from diagnoser.diagnosis.signals import FAILURE_TYPES as SIGNAL_TYPES
from diagnoser.diagnosis.signals import SignalReader, unexplained, with_resume
from diagnoser.diagnosis.trace import Trace, assemble
from diagnoser.ingest.framing import LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules import Action, JobScanner, RuleEvent, RuleRegistry, RuleSet
from diagnoser.templates.signals import LossRead, SignalConfig

MAX_EVENTS_PER_JOB = 2000
MAX_JOBS = 10_000
TAIL_LINES = 5
TAIL_LINE_CHARS = 2048
"""Tail lines kept for hang evidence are cut here: 10,000 jobs x nodes x 5 stays bounded."""
STEP_INTERVALS = 16
KEEP_NEW, KEEP_STORED, KEEP_ESTABLISHED, KEEP_PENDING = range(4)
"""Eviction classes, evicted in this order: a quiet job that sent one batch; a failing job
(its diagnosis is stored, and `absorb` brings its evidence back); a quiet job known longer (its
progress and tails cannot be rebuilt); events not yet settled, a hang, or a hang's resolve."""


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


def _attested(event: RuleEvent, node: str) -> RuleEvent:
    """An event from a stream whose node a bound token vouches for: a host its text names
    (`srun: error: node-7: ...`, torchrun's failure block) is the stream's own node, so a
    compromised node can implicate no one but itself."""
    if event.entities.get("host", node) == node:
        return event
    return replace(event, entities={**event.entities, "host": node})


def event_key(event: RuleEvent) -> tuple[str, str, int | None]:
    """One piece of evidence per (rule, node, rank), here as in correlation."""
    return (event.rule_id, event.node, event.rank)


@dataclass
class JobState:
    ruleset: RuleSet
    scanner: JobScanner
    events: dict[tuple[str, str, int | None], RuleEvent] = field(default_factory=dict)
    """First event per (rule, node, rank): repeats of a line add nothing to a diagnosis."""
    progress: Progress = field(default_factory=Progress)
    signals: SignalReader = field(default_factory=SignalReader)
    """NaN losses and loss spikes read from progress lines (diagnosis/signals.py)."""
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

    batches: int = 0
    """Batches seen: a job that sent one is new, perhaps junk, and the first to be evicted."""
    remote_line_at: float = 0.0
    remote_step_at: float | None = None
    """The newest line and step advance other replicas saw for the job (its streams may be
    spread over several): a stall is the whole job's, not this replica's share of it."""
    shared: tuple[float, float | None] | None = None
    """(last_line_at, last_step_at) as last handed to `take_activity`."""

    @property
    def keep(self) -> int:
        """What evicting the job would lose, from KEEP_NEW (least) to KEEP_PENDING (most)."""
        if self.dirty or self.resumed or self.hung_since is not None:
            return KEEP_PENDING
        if self.failing:
            return KEEP_STORED
        return KEEP_ESTABLISHED if self.batches > 1 or self.lifecycle is not None else KEEP_NEW

    @property
    def since(self) -> float:
        """Where the current stall starts: the last step, or the last line for a job without;
        on any replica (`remote_*`)."""
        steps = [t for t in (self.last_step_at, self.remote_step_at) if t is not None]
        if steps:
            return max(steps)
        return max(self.last_line_at, self.remote_line_at)

    def add(self, events: list[RuleEvent]) -> None:
        for event in events:
            key = event_key(event)
            if key not in self.events and len(self.events) < MAX_EVENTS_PER_JOB:
                self.events[key] = event
                self.dirty = True


class DiagnosisStage:
    """Per-job scanners, at most `max_jobs`: past it, the least recently active job of the
    lowest `JobState.keep` class present is evicted."""

    def __init__(
        self,
        registry: RuleRegistry,
        *,
        clock: Callable[[], float] = time.time,
        max_jobs: int = MAX_JOBS,
        hang_action: Action = hang.DEFAULT_ACTION,
        signals: SignalConfig | None = None,
        loss_reads: Callable[[LineBatch], Mapping[int, LossRead] | None] | None = None,
    ) -> None:
        self.registry = registry
        self.loss_reads = loss_reads
        """What an earlier stage read of a batch's progress lines for the loss reader
        (`CompressionStage.share_loss_reads`): those lines are not read again."""
        self.signals = signals or SignalConfig()
        """Loss-spike threshold and window (`DIAGNOSER_SIGNALS__*`)."""
        self.hang_action = hang_action
        """What a hang without a known cause recommends (`DIAGNOSER_HANG__ACTION`)."""
        self.clock = clock
        self.max_jobs = max_jobs
        self.jobs: OrderedDict[str, JobState] = OrderedDict()
        self._by_keep: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(4)]
        """Job ids by eviction class, least recently active first."""
        self._keep: dict[str, int] = {}
        self.events_by_rule: Counter[str] = Counter()
        """Every rule match, repeats included (bounded by the number of rules)."""

    def _job(self, job_id: str) -> JobState:
        state = self.jobs.get(job_id)
        if state is None:
            while self.jobs and len(self.jobs) >= self.max_jobs:
                self._evict()
            ruleset = self.registry.active  # a job keeps the rule set it started with
            state = self.jobs[job_id] = self._state(ruleset)
            self._file(job_id, state)
        else:
            self.jobs.move_to_end(job_id)
            self._by_keep[self._keep[job_id]].move_to_end(job_id)
        return state

    def _state(self, ruleset: RuleSet) -> JobState:
        return JobState(ruleset, JobScanner(ruleset), signals=SignalReader(self.signals))

    def _evict(self) -> None:
        """Drop one job's live state; what it had stored comes back through `absorb`."""
        job_id, _ = next(jobs for jobs in self._by_keep if jobs).popitem(last=False)
        del self.jobs[job_id], self._keep[job_id]

    def _file(self, job_id: str, state: JobState) -> None:
        """Keep the eviction classes in step after something that may change the job's."""
        if self.jobs.get(job_id) is not state:
            return  # evicted meanwhile
        keep, was = state.keep, self._keep.get(job_id)
        if keep != was:
            if was is not None:
                del self._by_keep[was][job_id]
            self._by_keep[keep][job_id] = None
            self._keep[job_id] = keep

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        state = self._job(key.job_id)
        now = self.clock()
        step = state.progress.last_step
        reads = self.loss_reads(batch) if self.loss_reads is not None else None
        state.progress.observe(batch, reads)
        state.nodes.add(key.node)
        state.batches += 1
        if batch.lines:
            self._observe_time(state, key.node, batch, now, step)
        events = state.scanner.feed(key.node, key.rank, batch, now)
        if key.attested:
            events = [_attested(event, key.node) for event in events]
        raised = state.signals.feed(key.node, key.rank, batch, now, reads)
        if raised:
            events = [*events, *unexplained(raised, events)]
        if events:
            state.add(events)
            self.events_by_rule.update(event.rule_id for event in events)
        self._file(key.job_id, state)

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
            state = self.jobs[job_id] = self._state(ruleset)
            state.lifecycle_loaded_at = loaded_at
        lifecycle.record(event)
        state.lifecycle = lifecycle
        state.checked_since = None
        self._file(job_id, state)

    def ended(self, job_id: str) -> bool:
        """Every process of the job has exited, as far as its launchers told (heartbeats aside)."""
        state = self.jobs.get(job_id)
        if state is None or state.lifecycle is None:
            return False
        return not state.lifecycle.running(self.clock(), float("inf"), state.nodes)

    def is_restart(self, job_id: str, event: hang.LifecycleEvent) -> bool:
        state = self.jobs.get(job_id)
        if state is None or not state.last_line_at:
            return False
        return (state.lifecycle or hang.Lifecycle()).is_restart(event)

    def tracks(self, job_id: str) -> bool:
        """The job has live state here (it sent logs or events to this process)."""
        return job_id in self.jobs

    def awaits_settle(self, job_id: str) -> bool:
        """New events or resumed progress that the flow's next settle would store: ingest
        commits such lines at once instead of at its next timed commit."""
        state = self.jobs.get(job_id)
        return state is not None and (state.dirty or state.resumed)

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
        self._file(job_id, state)
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

    def take_activity(self) -> dict[str, tuple[float, float | None]]:
        """(last line, last step advance) of every job whose own activity changed since the
        last call: what this replica tells the others (diagnosis/ownership.py)."""
        changed = {}
        for job_id, state in self.jobs.items():
            mine = (state.last_line_at, state.last_step_at)
            if mine != state.shared and state.last_line_at:
                state.shared = changed[job_id] = mine
        return changed

    def unshare(self, job_ids: Collection[str]) -> None:
        """The activity `take_activity` gave for these jobs was not stored: give it again."""
        for job_id in job_ids:
            state = self.jobs.get(job_id)
            if state is not None:
                state.shared = None

    def merge_remote(self, job_id: str, line_at: float, step_at: float | None) -> None:
        """The job's newest line and step advance on the other replicas. Progress there after
        a reported hang resumes it here, as a line seen here would."""
        state = self.jobs.get(job_id)
        if state is None:
            return
        before = state.since
        state.remote_line_at = max(state.remote_line_at, line_at)
        if step_at is not None:
            state.remote_step_at = max(state.remote_step_at or step_at, step_at)
        if state.hung_since is not None and state.since > before:
            state.hung_since = None
            state.resumed = True
            self._file(job_id, state)

    def hung_jobs(self) -> list[str]:
        """Jobs this replica holds a stored hang for: progress elsewhere must resolve it."""
        return [job_id for job_id, state in self.jobs.items() if state.hung_since is not None]

    def adopt_hang(self, job_id: str) -> None:
        """Another replica stored the hang of this job's current stall: it is not reported
        again, and progress seen here resolves it."""
        state = self.jobs.get(job_id)
        if state is not None and state.hung_since is None:
            state.hung_since = state.since
            self._file(job_id, state)

    def hang(self, job_id: str, window_s: float) -> tuple[Verdict, RuleSet, float] | None:
        """The job's hang verdict, if it is running and its logs do not say it finished; also
        the `since` to pass to `mark_hung`. A stall that is not a hang is not asked about again
        until the job writes or its launcher reports."""
        state = self.jobs.get(job_id)
        if state is None or state.failing or state.dirty or state.hung_since is not None:
            return None
        now = self.clock()
        if now - state.since < window_s:
            return None  # progress on another replica moved the stall's start
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
        self._file(job_id, state)
        return True

    def flag_resumed(self, job_id: str) -> None:
        """A resolve that failed to store: try again at the next settle."""
        state = self.jobs.get(job_id)
        if state is not None:
            state.resumed = True
            self._file(job_id, state)

    def trace(self, job_id: str) -> Trace | None:
        """What the LLM stage is shown for the job (diagnosis/trace.py); None: no live state."""
        state = self.jobs.get(job_id)
        if state is None:
            return None
        lifecycle = state.lifecycle or hang.Lifecycle()
        return assemble(
            job_id,
            list(state.events.values()),
            [
                hang.NodeTail(node, tuple(lines), state.node_last_at.get(node, 0.0))
                for node, lines in sorted(state.tails.items())
            ],
            [event for event in lifecycle.latest.values() if event.kind == "exited"],
            state.progress.as_record(),
            frozenset(state.nodes),
        )

    def progress(self, job_id: str) -> dict[str, int] | None:
        """Step, checkpoint and steps lost; when the verdict is a NaN loss or a loss spike, the
        step of the checkpoint to resume from (`resume_from_step`)."""
        state = self.jobs.get(job_id)
        if state is None:
            return None
        record = state.progress.as_record()
        resume = state.signals.progress()
        if not resume or state.last is None or state.last[2] not in SIGNAL_TYPES:
            return record  # the open diagnosis is about something else
        return {**(record or {}), **resume}

    def changed_verdict(self, job_id: str) -> tuple[Verdict, RuleSet] | None:
        """The job's verdict if new evidence changed it since the last call, else None."""
        state = self.jobs.get(job_id)
        if state is None or not state.dirty:
            return None
        state.dirty = False
        verdict = correlate(list(state.events.values()), state.ruleset, state.nodes)
        verdict = with_resume(verdict, state.signals)
        state.failing = verdict.status is not Status.HEALTHY
        self._file(job_id, state)
        key = verdict_key(verdict)
        if key == state.last:
            return None
        state.last = key
        return verdict, state.ruleset

    def ruleset(self, job_id: str) -> RuleSet | None:
        """The rule set the job's live state scans with (None: no live state)."""
        state = self.jobs.get(job_id)
        return state.ruleset if state is not None else None

    def event_keys(self, job_id: str) -> Collection[tuple[str, str, int | None]]:
        """The (rule, node, rank) of every event the job's live state holds."""
        state = self.jobs.get(job_id)
        return state.events.keys() if state is not None else ()

    def absorb(
        self, job_id: str, events: list[RuleEvent], nodes: Collection[str] = ()
    ) -> Verdict | None:
        """Stored evidence this live state has not seen joins it, and the verdict is made again.

        The events come from the job's open diagnosis, stored before this state began (the
        service restarted, the job was evicted, or another replica stored them); `nodes` are
        all the nodes the job's logs came from. The result is what one process that had seen
        every line would conclude. None when nothing was new, or the state is gone.
        """
        state = self.jobs.get(job_id)
        if state is None:
            return None
        new = [event for event in events if event_key(event) not in state.events]
        if not new:
            return None
        for event in new:  # past MAX_EVENTS_PER_JOB too: stored evidence is bounded already
            state.events.setdefault(event_key(event), event)
        state.nodes.update(nodes)
        verdict = with_resume(
            correlate(list(state.events.values()), state.ruleset, state.nodes), state.signals
        )
        state.failing = verdict.status is not Status.HEALTHY
        state.last = verdict_key(verdict)
        self._file(job_id, state)
        return verdict
