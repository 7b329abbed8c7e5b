"""Self-consistency: k samples, a majority on (category, action), gated by the vote share.

Majority voting amplifies a wrong answer when each sample is right less than half the time, as
small models are, so the winner alone decides nothing: its share of all k samples (abstentions
count against it) must reach `min_agreement`, or the verdict is inconclusive and a human looks.
`decided` lets the asker stop early once further samples cannot change the outcome (adaptive
consistency), which saves most calls when the first answers agree.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from diagnoser.llm.answer import Abstention, Answer
from diagnoser.rules.schema import Action, Category

Key = tuple[Category, Action]


@dataclass(frozen=True, slots=True)
class Verdict:
    decided: bool
    """True when the winner reached the agreement threshold; False means inconclusive."""
    category: Category | None
    action: Action
    failure_type: str | None
    culprit_nodes: tuple[str, ...]
    evidence: tuple[int, ...]
    summary: str
    mitigation: str
    confidence: float
    """Agreeing valid answers / k."""
    votes: dict[str, int]
    """`category/action` -> count, plus `abstain`."""
    asked: int
    """Samples actually taken (fewer than k after an early stop)."""


def _counts(samples: Sequence[Answer | Abstention]) -> Counter[Key]:
    return Counter((s.category, s.action) for s in samples if isinstance(s, Answer))


def needed(k: int, min_agreement: float) -> int:
    """Agreeing answers the winner needs out of k."""
    return max(1, math.ceil(min_agreement * k - 1e-9))


def decided(samples: Sequence[Answer | Abstention], k: int, min_agreement: float) -> bool:
    """Whether the remaining k - len(samples) answers can no longer change the outcome."""
    remaining = k - len(samples)
    if remaining <= 0:
        return True
    ranked = _counts(samples).most_common(2)
    leader = ranked[0][1] if ranked else 0
    second = ranked[1][1] if len(ranked) > 1 else 0
    if leader + remaining < needed(k, min_agreement):
        return True
    return leader >= needed(k, min_agreement) and leader > second + remaining


def tally(samples: Sequence[Answer | Abstention], k: int, min_agreement: float) -> Verdict:
    counts = _counts(samples)
    votes = {f"{c}/{a}": n for (c, a), n in counts.items()}
    abstained = sum(1 for s in samples if isinstance(s, Abstention))
    if abstained:
        votes["abstain"] = abstained
    ranked = counts.most_common(2)
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return _inconclusive(votes, ranked[0][1] / k if ranked else 0.0, len(samples))
    (category, action), agreeing = ranked[0]
    confidence = agreeing / k
    if agreeing < needed(k, min_agreement):
        return _inconclusive(votes, confidence, len(samples))
    winners = [
        s for s in samples if isinstance(s, Answer) and (s.category, s.action) == (category, action)
    ]
    culprits = _majority_nodes(winners)
    if action is Action.CORDON_NODE_AND_RESTART and not culprits:
        return _inconclusive(votes, confidence, len(samples))
    types = Counter(w.failure_type for w in winners).most_common(1)[0][0]
    representative = next(w for w in winners if w.failure_type == types)
    return Verdict(
        decided=True,
        category=category,
        action=action,
        failure_type=types,
        culprit_nodes=culprits,
        evidence=tuple(sorted({n for w in winners for n in w.evidence})),
        summary=representative.summary,
        mitigation=representative.mitigation,
        confidence=confidence,
        votes=votes,
        asked=len(samples),
    )


def _majority_nodes(winners: Sequence[Answer]) -> tuple[str, ...]:
    """Nodes that more than half of the agreeing answers name: one outlier cordons nothing."""
    named = Counter(node for w in winners for node in set(w.culprit_nodes))
    return tuple(sorted(node for node, n in named.items() if 2 * n > len(winners)))


def _inconclusive(votes: dict[str, int], confidence: float, asked: int) -> Verdict:
    return Verdict(
        decided=False,
        category=None,
        action=Action.ESCALATE,
        failure_type=None,
        culprit_nodes=(),
        evidence=(),
        summary="The LLM samples did not agree enough to decide; a human should look.",
        mitigation="",
        confidence=confidence,
        votes=votes,
        asked=asked,
    )
