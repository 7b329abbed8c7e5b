"""`ask`: k samples of one prompt, each checked against the trace, stopped once decided.

llama.cpp serves one choice per request, so k samples are k requests with distinct seeds. They
go out in rounds: first as many as the winner needs (all agreeing settles it), then one at a
time until `decided` says the rest cannot change the outcome. An unreachable or broken endpoint
ends the asking early; what was gathered is tallied over all k, so failures count as
disagreement and never as a vote.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnoser.config import LlmSettings
from diagnoser.llm.answer import Abstention, Answer, TraceLines, check
from diagnoser.llm.client import TRANSPORT_ERRORS, Completion, LlmClient, LlmUnavailableError
from diagnoser.llm.prompt import PromptLine, answer_schema
from diagnoser.llm.voting import Verdict, decided, needed, tally


@dataclass(frozen=True, slots=True)
class Asked:
    verdict: Verdict
    samples: tuple[Answer | Abstention, ...]
    calls: int
    tokens_in: int
    tokens_out: int
    latency_s: float
    mode: str
    """The structured-output mode the server ended up accepting."""

    @property
    def reached(self) -> bool:
        """The endpoint answered at least once (a bad answer counts; a failed call does not)."""
        return self.calls > 0 and not all(
            isinstance(s, Abstention) and s.reason.startswith(TRANSPORT_ERRORS)
            for s in self.samples
        )

    @property
    def failure(self) -> str | None:
        """Why the endpoint was not reached (the last transport error), when it was not."""
        if self.reached:
            return None
        reasons = [s.reason for s in self.samples if isinstance(s, Abstention)]
        return reasons[-1] if reasons else "circuit breaker open"


async def ask(
    client: LlmClient,
    messages: list[dict[str, str]],
    trace: TraceLines,
    *,
    k: int,
    min_agreement: float,
    temperature: float = 0.7,
    seed: int = 0,
    early_stop: bool = True,
    max_tokens: int = 512,
) -> Asked:
    schema = answer_schema()
    started = time.monotonic()
    samples: list[Answer | Abstention] = []
    completions: list[Completion] = []
    while len(samples) < k and not (early_stop and decided(samples, k, min_agreement)):
        agreeing = Counter((s.category, s.action) for s in samples if isinstance(s, Answer))
        leader = max(agreeing.values(), default=0)
        batch = max(1, needed(k, min_agreement) - leader) if early_stop else k
        batch = min(batch, k - len(samples))
        first_seed = seed + len(samples)
        try:
            results = await asyncio.gather(
                *(
                    client.complete_json(
                        messages, schema, seed=s, temperature=temperature, max_tokens=max_tokens
                    )
                    for s in range(first_seed, first_seed + batch)
                )
            )
        except LlmUnavailableError:
            break
        completions.extend(results)
        samples.extend(
            Abstention(c.error or "no answer") if c.payload is None else check(c.payload, trace)
            for c in results
        )
        if any(c.transport_failed for c in results):
            break
    return Asked(
        verdict=tally(samples, k, min_agreement),
        samples=tuple(samples),
        calls=len(completions),
        tokens_in=sum(c.tokens_in for c in completions),
        tokens_out=sum(c.tokens_out for c in completions),
        latency_s=time.monotonic() - started,
        mode=client.mode.label,
    )


def abstentions(samples: Sequence[Answer | Abstention]) -> list[str]:
    return [s.reason for s in samples if isinstance(s, Abstention)]


def vote_record(asked: Asked, lines: Sequence[PromptLine], settings: LlmSettings) -> dict[str, Any]:
    """The vote as kept with a diagnosis (and shown offline): outcome, tally, evidence, cost."""
    verdict = asked.verdict
    by_number = {line.number: line for line in lines}
    # Should a node's tail repeat a failure line, citing that copy cites the failure line.
    failing = {line.text for line in lines if line.flagged}
    return {
        "decided": verdict.decided,
        "category": verdict.category.value if verdict.category else None,
        "action": verdict.action.value,
        "failure_type": verdict.failure_type,
        "culprit_nodes": list(verdict.culprit_nodes),
        "summary": verdict.summary,
        "mitigation": verdict.mitigation,
        "confidence": verdict.confidence,
        "votes": verdict.votes,
        "k": settings.samples,
        "asked": verdict.asked,
        "min_agreement": settings.min_agreement,
        "abstentions": abstentions(asked.samples)[:10],
        "evidence": [
            {
                "line": n,
                "node": by_number[n].node,
                "text": by_number[n].text,
                "flagged": by_number[n].flagged or by_number[n].text in failing,
            }
            for n in verdict.evidence
            if n in by_number
        ],
        "model": settings.model,
        "prompt_version": settings.prompt_version,
        "output_mode": asked.mode,
        "tokens_in": asked.tokens_in,
        "tokens_out": asked.tokens_out,
        "latency_s": round(asked.latency_s, 3),
    }
