"""What one LLM sample must say, and the check of it against the evidence it was shown.

The model's text is untrusted: a log line can tell it to cordon a healthy node. So an answer is
parsed into a closed schema (enums, bounded strings) and then held to the trace: every cited
line must exist, every culprit must be a node of this job whose own lines are cited, and a
cordon needs a hardware category and, for each node it takes, a cited line from that node that
a rule found failure-looking (a node's quiet tail line does not incriminate it). An answer
that fails any check is an abstention with the reason, never a vote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagnoser.rules.schema import Action, Category

MAX_TEXT = 400
MAX_CITED = 32


class Fault(StrEnum):
    USER = "user"
    INFRASTRUCTURE = "infrastructure"
    UNKNOWN = "unknown"


class Answer(BaseModel):
    """The JSON object a sample must produce; its JSON schema is sent as `response_format`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    failure_type: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.]*$")
    category: Category
    fault: Fault
    culprit_nodes: list[str] = Field(default_factory=list, max_length=16)
    action: Action
    evidence: list[int] = Field(min_length=1, max_length=MAX_CITED)
    """Numbers of the trace lines (as numbered in the prompt) that show the failure."""
    summary: str = Field(min_length=1, max_length=MAX_TEXT)
    mitigation: str = Field(default="", max_length=MAX_TEXT)


@dataclass(frozen=True, slots=True)
class Abstention:
    reason: str


@dataclass(frozen=True, slots=True)
class TraceLines:
    """What the model was shown: trace line number -> the node whose stream it came from."""

    node_of_line: Mapping[int, str]
    job_nodes: frozenset[str]
    flagged: frozenset[int] | None = None
    """Lines a rule found failure-looking; None when the caller does not know (all count)."""


def check(payload: object, trace: TraceLines) -> Answer | Abstention:
    """Parse one sample's JSON payload and hold it to the trace."""
    try:
        answer = Answer.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "answer"
        return Abstention(f"schema: {where}: {first['msg']}")
    unknown = [n for n in answer.evidence if n not in trace.node_of_line]
    if unknown:
        return Abstention(f"cites lines not in the trace: {unknown[:5]}")
    cited_nodes = {trace.node_of_line[n] for n in answer.evidence}
    for node in answer.culprit_nodes:
        if node not in trace.job_nodes:
            return Abstention(f"culprit {node!r} is not a node of this job")
        if node not in cited_nodes:
            return Abstention(f"culprit {node!r} is named by no cited line from its own stream")
    if answer.action is Action.CORDON_NODE_AND_RESTART:
        if answer.category is not Category.HARDWARE:
            return Abstention(f"a cordon needs a hardware category, not {answer.category}")
        if not answer.culprit_nodes:
            return Abstention("a cordon names no culprit node")
        failing = {
            trace.node_of_line[n]
            for n in answer.evidence
            if trace.flagged is None or n in trace.flagged
        }
        for node in answer.culprit_nodes:
            if node not in failing:
                return Abstention(f"a cordon of {node!r} cites no failure line from its own stream")
    return answer
