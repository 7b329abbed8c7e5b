"""Run a diagnoser over the corpus: cases in, (expected, got) records out.

A diagnoser is any callable from a case to `Labels`. The rules path (`rules_diagnoser`) is
deterministic; a stage that samples (the LLM vote) plugs in the same way and is run `repeat`
times so the scoring can report its spread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from diagnoser.config import LlmSettings
from diagnoser.diagnosis.correlate import Verdict
from diagnoser.diagnosis.hang import DEFAULT_TIMEOUT_S
from diagnoser.diagnosis.offline import OfflineResult, consult, diagnose, node_logs
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


@dataclass
class LlmTally:
    """What the LLM stage did over an evaluation: per run, cases asked, decided, decided right."""

    asked: list[int] = field(default_factory=list)
    decided: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    unreachable: int = 0
    """Cases whose LLM could not be asked (they count as the rules left them)."""

    def new_run(self) -> None:
        self.asked.append(0)
        self.decided.append(0)
        self.right.append(0)


def llm_diagnoser(
    ruleset: RuleSet,
    settings: LlmSettings,
    tally: LlmTally,
    *,
    hang_timeout: float = DEFAULT_TIMEOUT_S,
    stalls: bool = True,
) -> Diagnoser:
    """The offline pipeline with the LLM stage (`diagnoser diagnose` with an LLM configured):
    what the rules leave `escalate` is asked, k samples and a vote, as the service asks it."""

    def run_case(case: Case) -> Labels:
        stalled_for = stall_of(case, hang_timeout) if stalls else None
        result = diagnose(
            node_logs(list(case.logs)), ruleset, stalled_for=stalled_for, hang_timeout=hang_timeout
        )
        if result.unresolved:
            result = _ask(result, case, tally)
        return labels(result.verdict)

    def _ask(result: OfflineResult, case: Case, tally: LlmTally) -> OfflineResult:
        tally.asked[-1] += 1
        consulted, failure = asyncio.run(consult(result, settings, case.id))
        if failure is not None:
            tally.unreachable += 1
            return result
        if consulted.verdict.source is not result.verdict.source:
            tally.decided[-1] += 1
            if consulted.verdict.action is case.expected.action:
                tally.right[-1] += 1
        return consulted

    return run_case


def run(
    cases: Sequence[Case],
    diagnoser: Diagnoser,
    repeat: int = 1,
    on_run: Callable[[], None] | None = None,
) -> list[list[Record]]:
    """`repeat` runs over every case, each a list of records in case order."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    runs = []
    for _ in range(repeat):
        if on_run is not None:
            on_run()
        runs.append(
            [
                Record(
                    case.id,
                    case.cls,
                    ", ".join(case.sources),
                    case.expected,
                    diagnoser(case),
                    case.split.value,
                    case.tags,
                )
                for case in cases
            ]
        )
    return runs
