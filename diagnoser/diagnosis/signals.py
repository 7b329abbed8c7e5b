"""Training signals as diagnoses: a NaN/inf loss or a loss spike becomes a rule-like event.

`SignalReader` is one job's reader of the numbers its progress lines carry (the `Signals` of
`templates/signals.py`). Each raised `nan_loss` or `loss_spike` becomes a `RuleEvent` with
rule id `signal.<type>`, so correlation, evidence, storage and the API treat it as any rule's
event; correlation ranks it with fallback rules (`correlate.SIGNAL_RULE_PREFIX`). The step to
resume from is the last checkpoint saved before the first such signal (where the Acme recovery
restarts, skipping the batches that caused it): in the event's entities, in the diagnosis's
`progress` record (`resume_from_step`) and in its summary.

Cheap on the ingest path: a batch without `oss` (loss, Loss) or `heckpoint` anywhere costs one
join and two substring searches; only lines with one of them are parsed.

A grad-norm NaN alone is not a diagnosis here (one can be a skipped fp16 step: the
`nan_grad_norm` rule wants three), and neither is a throughput drop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from diagnoser.diagnosis.correlate import SIGNAL_RULE_PREFIX, Verdict
from diagnoser.ingest.framing import LineBatch
from diagnoser.rules import Action, Category, RuleEvent, Scope, Severity
from diagnoser.templates.signals import LossRead, Signal, SignalConfig, SignalKind, Signals

DIAGNOSED: dict[SignalKind, Severity] = {
    SignalKind.NAN_LOSS: Severity.ERROR,
    SignalKind.LOSS_SPIKE: Severity.WARNING,
}
"""Signals that become diagnoses, with the severity of their event."""
RULE_IDS = {kind: f"{SIGNAL_RULE_PREFIX}{kind.value}" for kind in DIAGNOSED}
FAILURE_TYPES = frozenset(kind.value for kind in DIAGNOSED)
RESUME_KEY = "resume_from_step"
MAX_TEXT = 2048
"""A signal's line is cut here in its event (a progress line is short; a junk one may not be)."""


@dataclass(slots=True)
class SignalReader:
    """One job's training signals, read from every batch in arrival order."""

    config: SignalConfig = field(default_factory=SignalConfig)
    signals: Signals = field(init=False)
    first: Signal | None = None
    """The first diagnosed signal: its checkpoint is where a restart resumes."""

    def __post_init__(self) -> None:
        self.signals = Signals(self.config)

    @property
    def resume_from_step(self) -> int | None:
        return self.first.resume_from if self.first is not None else None

    def feed(
        self,
        node: str,
        rank: int | None,
        batch: LineBatch,
        now: float,
        reads: Mapping[int, LossRead] | None = None,
    ) -> list[RuleEvent]:
        """Events for the diagnosed signals the batch's lines raise. `reads`: what an earlier
        stage read of some of the lines (batch index -> `LossRead`), taken as read here."""
        lines = batch.lines
        if not lines:
            return []
        text = "\n".join(lines)
        if "oss" not in text and "heckpoint" not in text:
            return []
        signals = self.signals
        events = []
        for i, line in enumerate(lines):
            if "oss" not in line and "heckpoint" not in line:
                continue
            read = reads.get(i) if reads else None
            if read is None:
                signals.observe_loss(line, batch.first_line_no + i)
            else:
                signals.take_loss(read, batch.first_line_no + i)
            if not signals.raised:
                continue
            for signal in signals.raised:
                if signal.kind not in DIAGNOSED:
                    continue
                if self.first is None:
                    self.first = signal
                line_rank = batch.ranks[i] if batch.ranks is not None else None
                line_rank = rank if line_rank is None else line_rank
                events.append(_event(signal, line, node, line_rank, batch.start_of(i), now))
            signals.raised.clear()  # consumed here: the reader stays bounded
        return events

    def progress(self) -> dict[str, int]:
        """What the diagnosis's `progress` record gains: the step to resume from."""
        step = self.resume_from_step
        return {} if step is None else {RESUME_KEY: step}


def _event(
    signal: Signal, line: str, node: str, rank: int | None, offset: int, now: float
) -> RuleEvent:
    entities = {"value": _number(signal.value)}
    if signal.step is not None:
        entities["step"] = str(signal.step)
    if signal.baseline is not None:
        entities["baseline"] = _number(signal.baseline)
    if signal.resume_from is not None:
        entities[RESUME_KEY] = str(signal.resume_from)
    return RuleEvent(
        rule_id=RULE_IDS[signal.kind],
        failure_type=signal.kind.value,
        category=Category.USER_CODE,
        action=Action.NOTIFY_USER,
        severity=DIAGNOSED[signal.kind],
        scope=Scope.JOB,
        entities=entities,
        text=line[:MAX_TEXT],
        offset=offset,
        line_no=signal.line_no,
        node=node,
        rank=rank,
        time=now,
    )


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def unexplained(
    signal_events: Sequence[RuleEvent], rule_events: Sequence[RuleEvent]
) -> list[RuleEvent]:
    """Signal events whose line no rule event of the same failure type already covers: a NaN
    loss a rule caught is one piece of evidence, not two."""
    covered = {(e.node, e.line_no, e.failure_type) for e in rule_events}
    return [e for e in signal_events if (e.node, e.line_no, e.failure_type) not in covered]


def with_resume(verdict: Verdict, reader: SignalReader | None) -> Verdict:
    """The verdict's summary names the step to resume from, for a NaN loss or a loss spike."""
    if reader is None or verdict.failure_type not in FAILURE_TYPES:
        return verdict
    step = reader.resume_from_step
    if step is None:
        return verdict
    summary = f"{verdict.summary}; resume from the checkpoint of step {step}"
    return dataclasses.replace(verdict, summary=summary)
