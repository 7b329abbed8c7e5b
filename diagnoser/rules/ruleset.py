"""Compile validated rule files once: regexes, anchors, the prefilter, block-rule tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import regex

from diagnoser.rules import anchors as anchor_derivation
from diagnoser.rules import prefilter as prefilters
from diagnoser.rules.assembly import HEADLESS_ANCHORS, TRIGGERS
from diagnoser.rules.backtracking import too_slow
from diagnoser.rules.problems import Problem, RuleLoadError
from diagnoser.rules.schema import EXCEPTION_TEMPLATE, FAILURE_TYPES, Rule, RuleFile, Unit

if TYPE_CHECKING:
    from diagnoser.rules.engine import JobScanner

DEFAULT_TIMEOUT = 0.05
"""Seconds one regex may run on one candidate line before it is abandoned."""

_EVENT_FIELDS = frozenset({"node", "rank"})
_BLOCK_ENTITIES: dict[Unit, frozenset[str]] = {
    Unit.LINE: frozenset(),
    Unit.TRACEBACK: frozenset({"exception", "exception_qualname", "last_frame", "headless"}),
    Unit.CHILD_FAILED: frozenset(
        {"host", "rank", "local_rank", "exitcode", "pid", "signal", "failed_at", "script"}
    ),
    Unit.NCCL_ERROR: frozenset({"last_error", "nccl_version"}),
    Unit.ECC_SECTION: frozenset({"section"}),
    Unit.QUERY_CSV: frozenset({"fields"}),
}


@dataclass(frozen=True, slots=True)
class CompiledRule:
    spec: Rule
    file: str
    index: int
    patterns: tuple[regex.Pattern[str], ...]
    requires: tuple[regex.Pattern[str], ...]
    anchors: frozenset[str]
    caseless: bool

    @property
    def id(self) -> str:
        return self.spec.id


class RuleSet:
    """An immutable, compiled rule pack; `job_scanner()` starts scanning one job's streams.

    `digest` identifies the pack's content (stored with every diagnosis for reproducibility).
    """

    def __init__(
        self,
        files: Sequence[tuple[str, RuleFile]],
        digest: str,
        *,
        prefilter: str = "auto",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        problems: list[Problem] = []
        compiled: list[CompiledRule] = []
        seen: dict[str, str] = {}
        for file, rule_file in files:
            for spec in rule_file.rules:
                if spec.id in seen:
                    problems.append(
                        Problem(file, spec.id, f"duplicate id (also in {seen[spec.id]})")
                    )
                    continue
                seen[spec.id] = file
                rule = _compile(spec, file, len(compiled), problems)
                if rule is not None and not _backtracks(rule, file, timeout, problems):
                    compiled.append(rule)
        for rule in compiled:
            problems.extend(_check_relations(rule, seen))
        if problems:
            raise RuleLoadError(problems)

        self.digest = digest
        self.timeout = timeout
        self.files = tuple(file for file, _ in files)
        self.rules: tuple[CompiledRule, ...] = tuple(compiled)
        self.by_id = {r.id: r for r in compiled}
        self.block_rules: dict[Unit, tuple[CompiledRule, ...]] = {
            unit: tuple(r for r in compiled if r.spec.unit is unit) for unit in Unit
        }
        self.trigger_bits = {unit: 1 << (len(compiled) + i) for i, unit in enumerate(TRIGGERS)}
        self.trigger_mask = sum(self.trigger_bits.values())
        self.headless_bit = 1 << (len(compiled) + len(TRIGGERS))
        """Candidate bit of lines that may be a traceback's last line without its header."""
        self.prefilter = prefilters.build(self.anchors(), engine=prefilter)

    def anchors(self) -> list[prefilters.Anchor]:
        """Every line rule's anchors, the block triggers and the headless-exception anchors."""
        result = [
            prefilters.Anchor(literal, rule.caseless, 1 << rule.index)
            for rule in self.rules
            if rule.spec.unit is Unit.LINE
            for literal in sorted(rule.anchors)
        ]
        for unit, literals in TRIGGERS.items():
            result.extend(
                prefilters.Anchor(lit, False, self.trigger_bits[unit]) for lit in literals
            )
        result.extend(prefilters.Anchor(lit, False, self.headless_bit) for lit in HEADLESS_ANCHORS)
        return result

    def job_scanner(self) -> JobScanner:
        from diagnoser.rules.engine import JobScanner

        return JobScanner(self)

    def __len__(self) -> int:
        return len(self.rules)


def _compile(spec: Rule, file: str, index: int, problems: list[Problem]) -> CompiledRule | None:
    def fail(message: str) -> None:
        problems.append(Problem(file, spec.id, message))

    flags = regex.IGNORECASE if spec.ignore_case else 0
    patterns: list[regex.Pattern[str]] = []
    for i, source in enumerate((*spec.patterns, *spec.requires)):
        try:
            patterns.append(regex.compile(source, flags))
        except regex.error as exc:
            where = f"patterns[{i}]" if i < len(spec.patterns) else "requires"
            fail(f"{where}: invalid regex {source!r}: {exc}")
    if len(patterns) != len(spec.patterns) + len(spec.requires):
        return None
    main = patterns[: len(spec.patterns)]

    needed: set[str] = set()
    if spec.failure_type == EXCEPTION_TEMPLATE:
        needed.add("exception")
    if spec.action_from:
        needed.add(spec.action_from)
    if spec.window:
        needed.update(spec.window.same)
        if spec.window.distinct:
            needed.add(spec.window.distinct)
    needed -= _EVENT_FIELDS | _BLOCK_ENTITIES[spec.unit]
    for i, pattern in enumerate(main):
        missing = needed - set(pattern.groupindex)
        if missing:
            fail(f"patterns[{i}] lacks named group(s) {sorted(missing)} that the rule uses")
            return None

    literals: set[str] = set()
    caseless = spec.ignore_case
    if spec.unit is Unit.LINE:
        if spec.anchors is not None:
            bad = [a for a in spec.anchors if len(a) < anchor_derivation.MIN_DECLARED or "\n" in a]
            if bad or not spec.anchors:
                fail(f"anchors must be non-empty literals of 3+ characters without newlines: {bad}")
                return None
            literals.update(spec.anchors)
        else:
            for source in spec.patterns:
                try:
                    derived, derived_caseless = anchor_derivation.derive(
                        source, ignore_case=spec.ignore_case
                    )
                except anchor_derivation.AnchorError as exc:
                    fail(str(exc))
                    return None
                literals.update(derived)
                caseless = caseless or derived_caseless
    return CompiledRule(
        spec=spec,
        file=file,
        index=index,
        patterns=tuple(main),
        requires=tuple(patterns[len(spec.patterns) :]),
        anchors=frozenset(literals),
        caseless=caseless,
    )


def _backtracks(rule: CompiledRule, file: str, timeout: float, problems: list[Problem]) -> bool:
    """A pattern that blows up on adversarial input is a load problem (rule files are edited
    at runtime; see diagnoser/rules/backtracking.py)."""
    slow = [
        p.pattern
        for p in (*rule.patterns, *rule.requires)
        if too_slow(p, rule.spec.examples.match, timeout)
    ]
    for source in slow:
        problems.append(
            Problem(file, rule.id, f"pattern {source!r} backtracks catastrophically: over "
                    f"{timeout}s on adversarial input; make its repeats unambiguous")
        )  # fmt: skip
    return bool(slow)


def _check_relations(rule: CompiledRule, known: dict[str, str]) -> list[Problem]:
    problems: list[Problem] = []
    for name in ("symptom_of", "overrides"):
        relation = getattr(rule.spec, name)
        if relation is None:
            continue
        for other in relation.rules:
            if other not in known:
                problems.append(Problem(rule.file, rule.id, f"{name} names unknown rule {other!r}"))
        for ft in relation.failure_types:
            if ft not in FAILURE_TYPES:
                problems.append(
                    Problem(rule.file, rule.id, f"{name} names unknown failure type {ft!r}")
                )
    return problems
