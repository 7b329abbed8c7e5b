"""Run a diagnoser over the corpus: cases in, (expected, got) records out.

A diagnoser is any callable from a case to `Labels`. The rules path (`rules_diagnoser`) is
deterministic; a stage that samples (the LLM vote) plugs in the same way and is run `repeat`
times so the scoring can report its spread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from diagnoser.diagnosis.correlate import Verdict
from diagnoser.diagnosis.hang import DEFAULT_TIMEOUT_S
from diagnoser.diagnosis.offline import diagnose, node_logs
from diagnoser.evaluation.corpus import Case
from diagnoser.evaluation.scoring import Labels, Record
from diagnoser.rules import RuleSet

Diagnoser = Callable[[Case], Labels]


def labels(verdict: Verdict) -> Labels:
    return Labels(
        status=verdict.status,
        category=verdict.category,
        failure_type=verdict.failure_type or ("healthy" if verdict.root is None else None),
        action=verdict.action,
        culprit_nodes=tuple(sorted(verdict.culprit_nodes)),
    )


def stall_of(case: Case, hang_timeout: float) -> float | None:
    """The stall the case was observed in: the thread's duration, or, when it states a stall
    without one, the hang window itself (the moment a live service decides)."""
    if not case.stalled:
        return None
    return case.stalled_for if case.stalled_for is not None else hang_timeout


def rules_diagnoser(
    ruleset: RuleSet, *, hang_timeout: float = DEFAULT_TIMEOUT_S, stalls: bool = True
) -> Diagnoser:
    """The offline pipeline (`diagnoser diagnose`): rules, job-level correlation, and the hang
    check for cases observed stalled (`stalls=False` scores the log text alone)."""

    def run(case: Case) -> Labels:
        stalled_for = stall_of(case, hang_timeout) if stalls else None
        result = diagnose(
            node_logs(list(case.logs)), ruleset, stalled_for=stalled_for, hang_timeout=hang_timeout
        )
        return labels(result.verdict)

    return run


def run(cases: Sequence[Case], diagnoser: Diagnoser, repeat: int = 1) -> list[list[Record]]:
    """`repeat` runs over every case, each a list of records in case order."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    return [
        [
            Record(
                case.id,
                case.cls,
                ", ".join(case.sources),
                case.expected,
                diagnoser(case),
                case.split.value,
            )
            for case in cases
        ]
        for _ in range(repeat)
    ]
