"""The shared harness of the family tables (test_*_families.py, test_breadth_pass4.py,
test_escalation.py).

Each table file keeps its own progress lines, so the families are read after several loggers'
training steps; the way a table row becomes a log and a verdict is the same everywhere.
"""

from __future__ import annotations

from pathlib import Path

from diagnoser.diagnosis.correlate import Status, Verdict
from diagnoser.diagnosis.offline import diagnose, node_logs
from diagnoser.rules import Action, RuleSet


def verdict_of(pack: RuleSet, tmp_path: Path, steps: str, *texts: str) -> Verdict:
    """One node log per text (node-0, node-1, ...), each a few training steps and then the text."""
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"node-{i}.log"
        path.write_text(steps + text + "\n", encoding="utf-8")
        paths.append(path)
    return diagnose(node_logs(paths), pack).verdict


def assert_family_verdict(verdict: Verdict, failure_type: str, action: Action) -> None:
    """The family's failure type and action; a cordon names the one node that printed it."""
    assert (verdict.failure_type, verdict.action) == (failure_type, action)
    if action is Action.CORDON_NODE_AND_RESTART:
        assert verdict.culprit_nodes == ("node-0",)


def assert_healthy(verdict: Verdict) -> None:
    assert verdict.status is Status.HEALTHY, (verdict.failure_type, verdict.action)


def assert_escalates_naming(verdict: Verdict, line: str) -> None:
    """Inconclusive and escalated, with the line that made it so as the root's evidence."""
    assert verdict.status is Status.INCONCLUSIVE, (verdict.failure_type, verdict.action)
    assert verdict.action is Action.ESCALATE
    assert verdict.root is not None
    assert verdict.root.text.strip() in line
