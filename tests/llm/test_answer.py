"""An LLM answer counts only when the trace it was shown supports it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnoser.llm.answer import Abstention, Answer, TraceLines, check
from diagnoser.rules.schema import Action, Category

TRACE = TraceLines(
    node_of_line={1: "gpu-1", 2: "gpu-1", 3: "gpu-2", 4: "gpu-3"},
    job_nodes=frozenset({"gpu-1", "gpu-2", "gpu-3"}),
)


def answer(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "failure_type": "gpu_fallen_off_bus",
        "category": "hardware",
        "fault": "infrastructure",
        "culprit_nodes": ["gpu-3"],
        "action": "cordon_node_and_restart",
        "evidence": [4],
        "summary": "GPU on gpu-3 fell off the bus.",
        "mitigation": "Cordon gpu-3 and restart.",
    }
    base.update(overrides)
    return base


def test_a_supported_cordon_is_accepted() -> None:
    result = check(answer(), TRACE)
    assert isinstance(result, Answer)
    assert result.culprit_nodes == ["gpu-3"]
    assert result.action is Action.CORDON_NODE_AND_RESTART


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"culprit_nodes": ["gpu-99"], "evidence": [4]}, "not a node of this job"),
        ({"culprit_nodes": ["gpu-2"], "evidence": [4]}, "no cited line from its own stream"),
        ({"evidence": [9]}, "not in the trace"),
        ({"category": "user_code"}, "needs a hardware category"),
        ({"culprit_nodes": []}, "names no culprit"),
        ({"action": "reboot_cluster"}, "schema: action"),
        ({"category": "cosmic_rays"}, "schema: category"),
        ({"evidence": []}, "schema: evidence"),
        ({"summary": "x" * 5000}, "schema: summary"),
        ({"failure_type": "'; DROP TABLE"}, "schema: failure_type"),
    ],
)
def test_unsupported_answers_abstain_with_the_reason(
    overrides: dict[str, Any], reason: str
) -> None:
    result = check(answer(**overrides), TRACE)
    assert isinstance(result, Abstention)
    assert reason in result.reason


def test_a_restart_needs_no_culprit() -> None:
    result = check(
        answer(category="network", action="restart_job", culprit_nodes=[], evidence=[1, 3]),
        TRACE,
    )
    assert isinstance(result, Answer)
    assert result.category is Category.NETWORK


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=20,
)


@given(payload=JSONISH)
def test_random_json_never_raises_and_never_cordons_unsupported(payload: object) -> None:
    result = check(payload, TRACE)
    if isinstance(result, Answer) and result.action is Action.CORDON_NODE_AND_RESTART:
        assert set(result.culprit_nodes) <= {"gpu-1", "gpu-2", "gpu-3"}
        assert result.category is Category.HARDWARE


def test_a_cordon_needs_a_failure_line_from_the_culprit_not_its_quiet_tail() -> None:
    flagged = TraceLines(
        node_of_line={1: "gpu-2", 2: "gpu-1"},
        job_nodes=frozenset({"gpu-1", "gpu-2"}),
        flagged=frozenset({2}),
    )
    tail_only = check(answer(culprit_nodes=["gpu-2"], evidence=[1, 2]), flagged)
    assert isinstance(tail_only, Abstention)
    assert "cites no failure line" in tail_only.reason
    own_failure = check(answer(culprit_nodes=["gpu-1"], evidence=[2]), flagged)
    assert isinstance(own_failure, Answer)
