"""Retrieval: past diagnoses like this one, shown to the model as examples with their outcome.

The candidates are past diagnoses whose outcome someone stands behind: a rule (or the
correlation of several) decided them, or a person confirmed or overrode them. Diagnoses that
still say `escalate` carry no decision and are not candidates. The store hands over the most
recent few hundred (`DIAGNOSER_LLM__RETRIEVAL_CANDIDATES`), so the work per escalation is
bounded whatever the size of the history.

Similarity is TF-IDF cosine over the words of masked evidence lines (numbers and hex ids
replaced, as in the fingerprint), computed here in Python over just those candidates: no
embedding model, no hosted service, nothing leaves the process. The query is the trace's
failure-looking lines; a candidate is its stored evidence lines, root first. Words that every
candidate has (`error`, `rank`) weigh little; a rare exception name weighs a lot.

An example says who decided, the outcome (category, action, failure type) and one masked
evidence line. Identical examples (the same failure decided the same way on many jobs) are
shown once. Example text is untrusted log text like the trace: the prompt defuses it and puts
it inside the data delimiters, and the escalator redacts it first.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import regex

from diagnoser.diagnosis.trace import masked

MIN_SCORE = 0.2
"""Below this cosine a past diagnosis is about something else: better no example than a
misleading one."""
MAX_TEXTS = 10
"""Evidence lines of a candidate that count (root first): the rest is mostly context."""
MAX_EXAMPLE_LINE = 240

WORD = regex.compile(r"[a-z_][a-z0-9_]+")


class DecidedBy(StrEnum):
    RULE = "rule"
    CORRELATION = "correlation"
    CONFIRMED = "confirmed"
    """A person confirmed the diagnosis (whoever had decided it)."""
    OVERRIDDEN = "overridden"
    """A person set its category or action."""


@dataclass(frozen=True, slots=True)
class Precedent:
    diagnosis_id: str
    decided_by: DecidedBy
    category: str | None
    action: str
    failure_type: str | None
    texts: tuple[str, ...]
    """Evidence lines as stored, root first."""
    rule_id: str | None = None


@dataclass(frozen=True, slots=True)
class Match:
    precedent: Precedent
    score: float


def words(texts: Sequence[str]) -> Counter[str]:
    """The words of masked lines (the `<n>` of a masked number is no word)."""
    counts: Counter[str] = Counter()
    for text in texts[:MAX_TEXTS]:
        counts.update(WORD.findall(masked(text).lower()))
    return counts


def rank(
    query: Sequence[str], candidates: Sequence[Precedent], limit: int, min_score: float = MIN_SCORE
) -> list[Match]:
    """The `limit` candidates most similar to the query lines, best first.

    Candidates come most recent first; among equal scores the more recent wins.
    """
    if limit <= 0 or not candidates:
        return []
    documents = [words(c.texts) for c in candidates]
    frequency: Counter[str] = Counter()
    for document in documents:
        frequency.update(document.keys())
    total = len(documents)

    def vector(counts: Counter[str]) -> dict[str, float]:
        weights = {
            word: (1 + math.log(n)) * (math.log((1 + total) / (1 + frequency[word])) + 1)
            for word, n in counts.items()
        }
        norm = math.sqrt(sum(w * w for w in weights.values()))
        return {word: w / norm for word, w in weights.items()} if norm else {}

    wanted = vector(words(query))
    if not wanted:
        return []
    scored = []
    for index, document in enumerate(documents):
        have = vector(document)
        score = sum(w * have.get(word, 0.0) for word, w in wanted.items())
        if score >= min_score:
            scored.append((-score, index))
    scored.sort()
    return [Match(candidates[index], -negative) for negative, index in scored[:limit]]


def example(precedent: Precedent) -> str:
    """One line for the prompt: who decided, what they decided, and the line it was about."""
    if precedent.decided_by is DecidedBy.RULE and precedent.rule_id:
        who = f"decided by rule {precedent.rule_id}"
    else:
        who = {
            DecidedBy.RULE: "decided by a rule",
            DecidedBy.CORRELATION: "decided by correlating several rules",
            DecidedBy.CONFIRMED: "confirmed by a person",
            DecidedBy.OVERRIDDEN: "set by a person",
        }[precedent.decided_by]
    line = masked(precedent.texts[0]) if precedent.texts else ""
    if len(line) > MAX_EXAMPLE_LINE:
        line = line[:MAX_EXAMPLE_LINE] + " [...]"
    return (
        f"{who}: category {precedent.category or 'unknown'}, action {precedent.action}, "
        f"failure type {precedent.failure_type or 'unknown'}; evidence: {line}"
    )


def examples(query: Sequence[str], candidates: Sequence[Precedent], limit: int) -> list[str]:
    """The prompt's examples: the most similar distinct ones, best first."""
    chosen: list[str] = []
    for match in rank(query, candidates, len(candidates)):
        text = example(match.precedent)
        if text not in chosen:
            chosen.append(text)
        if len(chosen) >= limit:
            break
    return chosen


def covering(fingerprint: str, shown: Sequence[str]) -> str:
    """The fingerprint of the question once its examples are part of it.

    Examples change the prompt, so they are part of the question: the verdict cache is keyed by
    trace and examples together. Without examples the trace's fingerprint stands unchanged.
    With them, a person's correction reaches the next job: once someone overrides what the LLM
    said about a trace, the same trace elsewhere retrieves that override, becomes a different
    question, and is asked again instead of reusing the cached (wrong) answer. Examples are
    built from masked lines and outcomes only (no ids, no times) and covered as a set, so a
    new diagnosis decided the same way as an old one does not change the question.
    """
    if not shown:
        return fingerprint
    digest = hashlib.sha256(f"{fingerprint}\n".encode())
    for text in sorted(set(shown)):
        digest.update(f"{text}\n".encode())
    return digest.hexdigest()
