"""The LLM's trace: storms collapse, the earliest error survives the budget, nodes stay honest."""

from __future__ import annotations

from diagnoser.diagnosis.hang import LifecycleEvent, NodeTail, TailLine
from diagnoser.diagnosis.trace import MANY_NODES, Trace, assemble
from diagnoser.rules import RuleEvent
from diagnoser.rules.schema import Action, Category, Scope, Severity


def event(node: str, rank: int, text: str, t: float, line_no: int = 10) -> RuleEvent:
    return RuleEvent(
        rule_id="python.unknown_exception",
        failure_type="unknown",
        category=Category.USER_CODE,
        action=Action.ESCALATE,
        severity=Severity.ERROR,
        scope=Scope.JOB,
        entities={},
        text=text,
        offset=0,
        line_no=line_no,
        node=node,
        rank=rank,
        time=t,
        evidence=("Traceback (most recent call last):", '  File "train.py", line 7'),
    )


def test_a_storm_on_512_ranks_is_one_line_owned_by_no_node() -> None:
    storm = [
        event(
            f"gpu-{r // 8}", r, f"[rank{r}] Watchdog caught collective timeout SeqNum={r}", 10.0 + r
        )
        for r in range(512)
    ]
    trace = assemble("job", storm)
    collapsed = [line for line in trace.lines if line.count > 1]
    assert len(collapsed) == 1
    assert collapsed[0].count == 512
    assert collapsed[0].node == MANY_NODES
    assert MANY_NODES not in trace.nodes
    assert len(trace.nodes) == 64


def test_the_earliest_error_survives_any_budget() -> None:
    first = event("gpu-3", 5, "ZeroDivisionError: first failure", 1.0)
    later = [
        event("gpu-1", 0, f"OtherError: noise number {i} " + "x" * 200, 5.0 + i) for i in range(30)
    ]
    tails = [NodeTail("gpu-1", [TailLine("y" * 300, i, 0) for i in range(20)], 99.0)]
    trace = assemble("job", [*later, first], tails=tails, budget_chars=10)
    assert [line.text for line in trace.lines] == ["ZeroDivisionError: first failure"]
    assert trace.dropped > 0


def test_lines_are_numbered_in_log_order_with_exits_and_progress() -> None:
    trace = assemble(
        "job",
        [event("gpu-3", 5, "RuntimeError: boom", 2.0)],
        exits=[LifecycleEvent("exited", "gpu-3", 3.0, exit_code=1)],
        progress={"last_step": 1200},
    )
    texts = [line.text for line in trace.lines]
    assert texts[-3:] == [
        "RuntimeError: boom",
        "process exited with exit code 1",
        "progress: last_step 1200",
    ]
    assert [line.number for line in trace.lines] == list(range(1, len(trace.lines) + 1))
    assert trace.checkable.node_of_line[len(texts) - 2] == "gpu-3"


def test_fingerprint_ignores_numbers_but_not_the_model_or_the_text() -> None:
    a = assemble("job-a", [event("gpu-3", 5, "CUDA error at step 100", 1.0)])
    b = assemble("job-b", [event("gpu-3", 7, "CUDA error at step 250", 9.0)])
    c = assemble("job-c", [event("gpu-3", 5, "cuDNN error at step 100", 1.0)])
    assert a.fingerprint("m", "diagnose.v1") == b.fingerprint("m", "diagnose.v1")
    assert a.fingerprint("m", "diagnose.v1") != a.fingerprint("other", "diagnose.v1")
    assert a.fingerprint("m", "diagnose.v1") != c.fingerprint("m", "diagnose.v1")


def test_a_trace_survives_a_json_round_trip() -> None:
    trace = assemble("job", [event("gpu-3", 5, "RuntimeError: boom", 2.0)])
    again = Trace.from_json(trace.to_json())
    assert again == trace


def test_a_failure_line_that_is_also_a_last_line_is_shown_once_and_flagged() -> None:
    failure = event("gpu-1", 0, "FluxCapacitorError: drifted", 0.0, line_no=12)
    tail = NodeTail(
        "gpu-1",
        [
            TailLine('  File "train.py", line 7', 11, 0),
            TailLine("FluxCapacitorError: drifted", 12, 0),
            TailLine("shutting down", 13, 0),
        ],
    )
    trace = assemble("job", [failure], tails=[tail])
    texts = [line.text for line in trace.lines]
    assert texts.count("FluxCapacitorError: drifted") == 1
    assert texts.count('  File "train.py", line 7') == 1
    assert "shutting down" in texts
    [shown] = [line for line in trace.lines if line.text == "FluxCapacitorError: drifted"]
    assert shown.flagged, "the copy a model cites is the one a cordon may rest on"
