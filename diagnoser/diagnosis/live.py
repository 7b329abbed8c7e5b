"""The live diagnosis stage: rule scanning per job as lines arrive, verdicts on demand.

It sits in the ingest pipeline, so it only scans and remembers (in memory, bounded); turning a
changed verdict into a stored diagnosis is the flow's job, after the lines are committed.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnoser.diagnosis.correlate import Verdict, correlate
from diagnoser.diagnosis.progress import Progress
from diagnoser.ingest.framing import LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules import JobScanner, RuleEvent, RuleRegistry, RuleSet

MAX_EVENTS_PER_JOB = 2000
MAX_JOBS = 10_000


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
        state.progress.observe(batch)
        state.nodes.add(key.node)
        events = state.scanner.feed(key.node, key.rank, batch, self.clock())
        if events:
            state.add(events)
            self.events_by_rule.update(event.rule_id for event in events)

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
        key = verdict_key(verdict)
        if key == state.last:
            return None
        state.last = key
        return verdict, state.ruleset
