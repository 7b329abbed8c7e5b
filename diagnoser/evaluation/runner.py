"""Run a diagnoser over the corpus: cases in, (expected, got) records out.

A diagnoser is any callable from a case to `Labels`. The rules path (`rules_diagnoser`) is
deterministic; a stage that samples (the LLM vote) plugs in the same way and is run `repeat`
times so the scoring can report its spread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from diagnoser.diagnosis.correlate import Verdict
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


def rules_diagnoser(ruleset: RuleSet) -> Diagnoser:
    """The offline pipeline (`diagnoser diagnose`): rules, then job-level correlation."""

    def run(case: Case) -> Labels:
        return labels(diagnose(node_logs(list(case.logs)), ruleset).verdict)

    return run


def run(cases: Sequence[Case], diagnoser: Diagnoser, repeat: int = 1) -> list[list[Record]]:
    """`repeat` runs over every case, each a list of records in case order."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    return [
        [
            Record(case.id, case.cls, ", ".join(case.sources), case.expected, diagnoser(case))
            for case in cases
        ]
        for _ in range(repeat)
    ]
