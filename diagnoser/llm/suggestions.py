"""Learning rules: a failure the LLM keeps resolving alike becomes a suggested rule for a person.

What counts. A resolution is a diagnosis the LLM decided (its vote reached the agreement
threshold), on any job, whether the vote was asked for that job or reused from the verdict
cache: each job that hit the failure is one more time it was seen and resolved, and a cached
verdict is the same question answered. They are counted per masked root line, across
fingerprints (the same failure on other nodes, other ranks, other counts is one failure), and
per job (a job's restarts count once). A person's override of such a diagnosis counts as a vote
for what the person said. Resolutions are grouped by the pattern their root line yields; the
most common (category, action) of a group is suggested once `DIAGNOSER_LLM__SUGGEST_AFTER`
jobs (default 3) agree on it and it holds at least the agreement threshold's share of the
group's jobs; otherwise it is withheld, with the reason.

The root line is the first line the winning answers cited that a rule had found
failure-looking. A verdict that cites no such line is not counted: a pattern built from a
progress line or a node's tail would fire on healthy jobs.

The pattern. The line's launcher prefix and timestamp are dropped (line rules search the whole
line, so the rule matches with any prefix), it is cut to its first 160 characters, its literal
text is regex-escaped, and its variable parts become typed slots: decimal numbers `\\d+`,
`0x` hex, long hex ids, and `\\S+` where the trace had a redacted secret. Log text never
becomes regex syntax. The longest literal run is the rule's prefilter anchor; a line with less
than 8 characters of literal text yields no rule.

The vocabulary. Category and action are the rules' own enums already. The failure type must be
one of the schema's closed table (docs/failure-taxonomy.md), of the same category; the LLM
names types freely (`flux_capacitor_drift`), so a type outside the table falls back to
`{exception}` when the root line is a Python exception line and the category is user_code or
framework (the rule then captures the exception's name, as the shipped traceback rules do).
Anything else is not offered: a rule with a made-up or mismatched type would put a wrong name
on every future diagnosis, and a person can still write the rule by hand.

Validation. A suggestion is a `Rule` (the strict schema) with the resolutions' root lines as
`examples.match` and a benign training line as `examples.no_match`, compiled and run through
the engine like any rule; one that fails is withheld with the problem. Nothing is enabled here:
a person accepts a suggestion (`diagnoser.rules.learned.add_rule`) and the pack reloads.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import regex
from pydantic import ValidationError

from diagnoser.diagnosis.trace import VARIABLE
from diagnoser.rules.learned import LEARNED_DESCRIPTION, LEARNED_FAMILY, LEARNED_FILE
from diagnoser.rules.registry import check_files
from diagnoser.rules.schema import (
    ACTION_STRICTNESS,
    EXCEPTION_TEMPLATE,
    FAILURE_TYPES,
    Action,
    Category,
    Rule,
    RuleFile,
    Scope,
    Severity,
)

MAX_SOURCE_CHARS = 160
MIN_ANCHOR_CHARS = 8
MAX_MATCH_EXAMPLES = 3
MAX_DESCRIPTION = 600
BENIGN_LINES = (
    "[rank0]: iteration 100/1000 | lm loss 2.314 | grad norm 0.98 | lr 3.0e-04",
    "INFO: saved checkpoint to /checkpoints/step_100",
    "Epoch 1/10: 100%| 500/500 [01:40<00:00, 5.00it/s]",
)
"""Healthy training output, the `examples.no_match` of a learned rule (the first it misses)."""

LEAD = regex.compile(
    r"^(?:\s+|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\[[A-Za-z_][A-Za-z_-]{0,15}\d{1,7}\]:| {0,8}\d{1,8}: )+"
)
"""Timestamps and launcher prefixes (`[rank3]:`, `[default0]:`, `srun --label`'s `3: `)."""
CUT_MARK = " [...]"
REDACTED = r"\[REDACTED:[a-z_]+\]"
SLOT = regex.compile(f"(?P<redacted>{REDACTED})|{VARIABLE.pattern}")
EXCEPTION_LINE = regex.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*(?:Error|Exception))(?=:|$)")


@dataclass(frozen=True, slots=True)
class Resolution:
    """One diagnosis the LLM decided, as the store hands it over (most recent first)."""

    diagnosis_id: str
    job_id: str
    line: str
    """The root line the winning answers cited (the redacted trace's text)."""
    category: str | None
    action: str
    failure_type: str | None
    """The LLM's name for it, free text."""
    culprit_nodes: tuple[str, ...] = ()
    summary: str = ""
    by_person: bool = False
    """A person overrode the LLM; category and action are the person's."""


@dataclass(frozen=True, slots=True)
class LinePattern:
    pattern: str
    anchor: str
    exception: str | None
    """The exception name when the line is a Python exception line."""


@dataclass(frozen=True, slots=True)
class Suggestion:
    id: str
    rule: Rule
    jobs: int
    """Jobs whose diagnosis agreed on the rule's outcome."""
    share: float
    """Their share of all jobs whose root line yields this pattern."""
    diagnoses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Withheld:
    id: str
    pattern: str
    jobs: int
    reason: str


def pattern_of(line: str) -> LinePattern | None:
    """The regex a line yields (literals escaped, variables as typed slots), or None."""
    text = LEAD.sub("", line.removesuffix(CUT_MARK), count=1)[:MAX_SOURCE_CHARS].rstrip()
    parts: list[str] = []
    runs: list[str] = []
    run = ""
    pos = 0
    exception = None
    found = EXCEPTION_LINE.match(text)
    if found is not None:
        exception = found.group("name")
        parts.append(rf"\b(?:\w+\.)*(?P<exception>{_escape(exception)})")
        run, pos = exception, found.end()
    for slot in SLOT.finditer(text, pos):
        literal = text[pos : slot.start()]
        parts.append(_escape(literal))
        runs.append(run + literal)
        run = ""
        parts.append(_slot(slot))
        pos = slot.end()
    parts.append(_escape(text[pos:]))
    runs.append(run + text[pos:])
    anchor = max(runs, key=len).strip()
    if len(anchor) < MIN_ANCHOR_CHARS:
        return None
    return LinePattern("".join(parts), anchor, exception)


def _escape(text: str) -> str:
    return str(regex.escape(text, literal_spaces=True))


def _slot(slot: regex.Match[str]) -> str:
    value = slot.group(0)
    if slot.group("redacted"):
        return r"\S+"
    if value.startswith("0x"):
        return r"0x[0-9a-fA-F]+"
    if len(value) >= 8 and not value.replace(".", "").isdigit():
        return r"[0-9a-fA-F]{8,}"
    return r"\d+(?:\.\d+)?"


def suggestion_id(pattern: str, category: str | None, action: str) -> str:
    return hashlib.sha256(f"{pattern}\n{category}\n{action}".encode()).hexdigest()[:12]


def rule_id(suggestion: str) -> str:
    return f"learned_{suggestion}"


def suggest(
    resolutions: Sequence[Resolution], *, after: int, min_share: float
) -> tuple[list[Suggestion], list[Withheld]]:
    """Suggestions (most jobs first) and the groups that reached the count but are withheld."""
    groups: dict[str, tuple[LinePattern, list[Resolution]]] = {}
    for resolution in resolutions:
        found = pattern_of(resolution.line)
        if found is not None:
            groups.setdefault(found.pattern, (found, []))[1].append(resolution)
    suggestions: list[Suggestion] = []
    withheld: list[Withheld] = []
    for found, members in groups.values():
        jobs: dict[tuple[str | None, str], set[str]] = {}
        for member in members:
            jobs.setdefault((member.category, member.action), set()).add(member.job_id)
        ranked = sorted(jobs.items(), key=lambda item: -len(item[1]))
        (category, action), agreeing = ranked[0]
        if len(agreeing) < after:
            continue
        total = sum(len(j) for j in jobs.values())
        share = len(agreeing) / total
        sid = suggestion_id(found.pattern, category, action)
        if share < min_share or (len(ranked) > 1 and len(ranked[1][1]) == len(agreeing)):
            others = ", ".join(f"{c}/{a}: {len(j)}" for (c, a), j in ranked)
            reason = f"the verdicts disagree ({others} jobs)"
            withheld.append(Withheld(sid, found.pattern, len(agreeing), reason))
            continue
        winners = [m for m in members if (m.category, m.action) == (category, action)]
        built = build_rule(sid, found, winners, len(agreeing))
        if isinstance(built, str):
            withheld.append(Withheld(sid, found.pattern, len(agreeing), built))
            continue
        diagnoses = tuple(dict.fromkeys(m.diagnosis_id for m in winners))
        suggestions.append(Suggestion(sid, built, len(agreeing), share, diagnoses))
    suggestions.sort(key=lambda s: (-s.jobs, s.id))
    return suggestions, withheld


def failure_type_for(
    category: Category, named: Sequence[str | None], exception: str | None
) -> str | None:
    """The schema's failure type for what the LLM named: its own if the taxonomy has it with
    this category, `{exception}` for an exception line of user code or the framework, else None.
    """
    counts = Counter(name.strip().lower() for name in named if name)
    for name, _ in counts.most_common(1):
        known = FAILURE_TYPES.get(name)
        if known is not None and known[0] is category:
            return name
    if exception is not None and category in (Category.USER_CODE, Category.FRAMEWORK):
        return EXCEPTION_TEMPLATE
    return None


def build_rule(
    sid: str, found: LinePattern, winners: Sequence[Resolution], jobs: int
) -> Rule | str:
    """The validated rule for a group's winning outcome, or why there is none."""
    first = winners[0]
    try:
        category = Category(first.category or "")
        action = Action(first.action)
    except ValueError:
        return f"outcome {first.category}/{first.action} is not in the rules' vocabulary"
    if action in (Action.ESCALATE, Action.NONE):
        return f"a rule whose action is {action.value} decides nothing"
    failure_type = failure_type_for(category, [w.failure_type for w in winners], found.exception)
    if failure_type is None:
        named = Counter(w.failure_type for w in winners).most_common(1)[0][0]
        return (
            f"the LLM's failure type {named!r} is not a {category.value} type of the taxonomy "
            "(docs/failure-taxonomy.md) and the line names no exception"
        )
    compiled = regex.compile(found.pattern)
    benign = next((line for line in BENIGN_LINES if compiled.search(line) is None), None)
    if benign is None:
        return "the pattern matches healthy training lines"
    cordon = action is Action.CORDON_NODE_AND_RESTART
    reason = None
    default = FAILURE_TYPES.get(failure_type)
    if default is not None and ACTION_STRICTNESS[action] < ACTION_STRICTNESS[default[1]]:
        reason = f"the LLM chose {action.value} on {jobs} jobs; check before accepting"
    summary = " ".join(first.summary.split())
    description = (
        f"Learned from LLM verdicts on {jobs} jobs ({category.value}, {action.value})."
        + (f" The LLM said: {summary}" if summary else "")
    )[:MAX_DESCRIPTION]
    matches = tuple(dict.fromkeys(w.line.removesuffix(CUT_MARK) for w in winners))
    try:
        rule = Rule.model_validate(
            {
                "id": rule_id(sid),
                "description": description,
                "failure_type": failure_type,
                "category": category,
                "severity": Severity.CRITICAL if cordon else Severity.ERROR,
                "scope": Scope.NODE if cordon else Scope.JOB,
                "action": action,
                "action_reason": reason,
                "patterns": (found.pattern,),
                "anchors": (found.anchor,),
                "examples": {"match": matches[:MAX_MATCH_EXAMPLES], "no_match": (benign,)},
            }
        )
    except ValidationError as exc:
        return f"not a valid rule: {exc.errors()[0]['msg']}"
    problems = check_files([(LEARNED_FILE, alone(rule))])
    if problems:
        return f"fails the rule checks: {problems[0]}"
    return rule


def alone(rule: Rule) -> RuleFile:
    """A rule file holding just this rule."""
    return RuleFile(family=LEARNED_FAMILY, description=LEARNED_DESCRIPTION, rules=(rule,))
