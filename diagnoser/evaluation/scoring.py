"""Scoring: pure functions over (expected, got) records. No I/O, no diagnoser run.

One run of the corpus is a list of `Record`s; `score` turns it into `Metrics` per class and in
total. A nondeterministic diagnoser (the LLM stage) is run several times: `summarise` reduces the
runs to the mean and spread of every metric, and `gate` checks the result against the floors.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from diagnoser.diagnosis.correlate import Status
from diagnoser.rules import Action, Category

TOTAL = "total"
MISLEADING = "misleading"
"""The case tag for a log that points at another cause than the one its thread established
(set when the case is labelled, before any diagnoser run): no reading of the text can be right
on it except by luck, so the report also scores the cases without it."""


@dataclass(frozen=True, slots=True)
class Labels:
    """A diagnosis reduced to what is scored: a case's label, or what a diagnoser answered."""

    status: Status
    category: Category | None
    failure_type: str | None
    action: Action
    culprit_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Floors:
    """Minimum total accuracies (0..1); below any of them the evaluation fails. None: no floor."""

    action: float | None = None
    category: float | None = None
    culprit: float | None = None
    splits: Mapping[str, Floors] = field(default_factory=dict)
    """The same floors for one side of the split (`dev`, `test`), checked on that side alone."""


class Miss(StrEnum):
    ACTION = "action"
    CATEGORY = "category"
    CULPRIT = "culprit"
    FALSE_CORDON = "false_cordon"


class Outcome(StrEnum):
    """How a case's action and category came out, one of four (culprits are scored apart).

    `silent` is the worst: a failing log called healthy, so nobody looks. `deferred` is honest
    (a person or the LLM stage decides). `wrong` is a confident wrong answer."""

    RIGHT = "right"
    SILENT = "silent"
    DEFERRED = "deferred"
    WRONG = "wrong"


@dataclass(frozen=True, slots=True)
class Record:
    """One case diagnosed once."""

    case_id: str
    cls: str
    source: str
    expected: Labels
    got: Labels
    split: str = "dev"
    """`dev` or `test` (evals/README.md): the side of the held-back split the case is on."""
    tags: tuple[str, ...] = ()
    """The case's tags (`truncated`, `misleading`, ...), as labelled."""

    @property
    def action_ok(self) -> bool:
        return self.got.action is self.expected.action

    @property
    def category_ok(self) -> bool:
        return self.got.category == self.expected.category

    @property
    def culprit_ok(self) -> bool | None:
        """Exact node-set match; None when the label names no culprit (not scored)."""
        if not self.expected.culprit_nodes:
            return None
        return set(self.got.culprit_nodes) == set(self.expected.culprit_nodes)

    @property
    def false_cordon(self) -> bool:
        """A cordon where none was expected, or one that takes out a node the label does not
        name: either way a healthy node leaves the cluster."""
        if self.got.action is not Action.CORDON_NODE_AND_RESTART:
            return False
        if self.expected.action is not Action.CORDON_NODE_AND_RESTART:
            return True
        return not set(self.got.culprit_nodes) <= set(self.expected.culprit_nodes)

    @property
    def missed_cordon(self) -> bool:
        return (
            self.expected.action is Action.CORDON_NODE_AND_RESTART
            and self.got.action is not Action.CORDON_NODE_AND_RESTART
        )

    @property
    def inconclusive(self) -> bool:
        """What the rules could not settle: the cases a later LLM stage receives."""
        return self.got.status is Status.INCONCLUSIVE or self.got.action is Action.ESCALATE

    @property
    def failing(self) -> bool:
        """The label says something went wrong (a failure, or a stop only a person can read)."""
        return self.expected.status is not Status.HEALTHY

    @property
    def outcome(self) -> Outcome:
        if self.action_ok and self.category_ok:
            return Outcome.RIGHT
        if self.failing and self.got.status is Status.HEALTHY:
            return Outcome.SILENT
        if self.got.action is Action.ESCALATE and self.expected.action is not Action.ESCALATE:
            return Outcome.DEFERRED
        return Outcome.WRONG

    @property
    def benign_silent(self) -> bool | None:
        """A benign log that stayed healthy; None for a failing case (not scored)."""
        if self.failing:
            return None
        return self.got.status is Status.HEALTHY

    @property
    def misses(self) -> tuple[Miss, ...]:
        found = []
        if not self.action_ok:
            found.append(Miss.ACTION)
        if not self.category_ok:
            found.append(Miss.CATEGORY)
        if self.culprit_ok is False:
            found.append(Miss.CULPRIT)
        if self.false_cordon:
            found.append(Miss.FALSE_CORDON)
        return tuple(found)


METRICS = (
    "action_accuracy",
    "category_accuracy",
    "culprit_accuracy",
    "false_cordons",
    "missed_cordons",
    "inconclusive_rate",
    "silent_misses",
    "deferrals",
    "wrong_answers",
    "benign_silence",
)
"""Metric names, in report order. Accuracies and rates are 0..1; cordons, silent misses,
deferrals and wrong answers are counts; benign silence is the share of benign cases that stayed
healthy."""


@dataclass(frozen=True, slots=True)
class Metrics:
    cases: int = 0
    action_correct: int = 0
    category_correct: int = 0
    culprit_cases: int = 0
    """Cases whose label names culprit nodes: the denominator of culprit accuracy."""
    culprit_correct: int = 0
    false_cordons: int = 0
    missed_cordons: int = 0
    inconclusive: int = 0
    failing: int = 0
    """Cases whose label is not healthy: the denominator of the silent-miss share."""
    silent: int = 0
    deferred: int = 0
    wrong: int = 0
    benign: int = 0
    benign_silent: int = 0

    def values(self) -> dict[str, float | None]:
        """Metric name -> value; None where the denominator is zero."""

        def rate(part: int, whole: int) -> float | None:
            return part / whole if whole else None

        return {
            "action_accuracy": rate(self.action_correct, self.cases),
            "category_accuracy": rate(self.category_correct, self.cases),
            "culprit_accuracy": rate(self.culprit_correct, self.culprit_cases),
            "false_cordons": float(self.false_cordons),
            "missed_cordons": float(self.missed_cordons),
            "inconclusive_rate": rate(self.inconclusive, self.cases),
            "silent_misses": float(self.silent),
            "deferrals": float(self.deferred),
            "wrong_answers": float(self.wrong),
            "benign_silence": rate(self.benign_silent, self.benign),
        }


def _metrics(records: Iterable[Record]) -> Metrics:
    counts: defaultdict[str, int] = defaultdict(int)
    for r in records:
        counts["cases"] += 1
        counts["action_correct"] += r.action_ok
        counts["category_correct"] += r.category_ok
        culprit = r.culprit_ok
        if culprit is not None:
            counts["culprit_cases"] += 1
            counts["culprit_correct"] += culprit
        counts["false_cordons"] += r.false_cordon
        counts["missed_cordons"] += r.missed_cordon
        counts["inconclusive"] += r.inconclusive
        counts["failing"] += r.failing
        outcome = r.outcome
        counts["silent"] += outcome is Outcome.SILENT
        counts["deferred"] += outcome is Outcome.DEFERRED
        counts["wrong"] += outcome is Outcome.WRONG
        benign = r.benign_silent
        if benign is not None:
            counts["benign"] += 1
            counts["benign_silent"] += benign
    return Metrics(**counts)


def score(records: Sequence[Record]) -> dict[str, Metrics]:
    """Metrics per class, sorted by class name, then `TOTAL` over every record."""
    by_class: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_class[record.cls].append(record)
    scores = {cls: _metrics(by_class[cls]) for cls in sorted(by_class)}
    scores[TOTAL] = _metrics(records)
    return scores


@dataclass(frozen=True, slots=True)
class Spread:
    """A metric over repeated runs (population stdev: 0 for one run or a deterministic stage)."""

    mean: float
    stdev: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.fmean(values), statistics.pstdev(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class CaseMiss:
    """A case missed in at least one run; `got` is from the first run that missed it."""

    case_id: str
    cls: str
    source: str
    expected: Labels
    got: Labels
    kinds: tuple[Miss, ...]
    runs_missed: int
    runs: int
    split: str = "dev"
    outcome: Outcome = Outcome.WRONG


@dataclass(frozen=True, slots=True)
class Summary:
    runs: int
    cases: dict[str, int]
    """Class (and `TOTAL`) -> number of cases."""
    metrics: dict[str, dict[str, Spread | None]]
    """Class (and `TOTAL`) -> metric name -> spread over runs (None: no denominator)."""
    misses: tuple[CaseMiss, ...] = field(default=())
    splits: Mapping[str, Summary] = field(default_factory=dict)
    """The same summary over each side of the split alone (`dev`, `test`), when the records
    carry more than one."""
    without_misleading: Summary | None = None
    """The same summary (with its splits) over the cases not tagged `misleading`, when some
    are: what a reading of the text can get right, apart from the cases whose text points
    elsewhere."""

    def gap(self, metric: str = "action_accuracy") -> float | None:
        """Dev minus test on a metric: how much of the dev score is memory, not skill."""
        dev, test = self.splits.get("dev"), self.splits.get("test")
        if dev is None or test is None:
            return None
        a, b = dev.metrics[TOTAL][metric], test.metrics[TOTAL][metric]
        return a.mean - b.mean if a is not None and b is not None else None


def _spread(values: list[float | None]) -> Spread | None:
    present = [v for v in values if v is not None]
    return Spread.of(present) if present else None


def summarise(runs: Sequence[Sequence[Record]]) -> Summary:
    """Reduce N runs over the same cases to each metric's spread, and the cases ever missed;
    and the same for each side of the split, and over the cases not tagged `misleading`."""
    if not runs:
        raise ValueError("nothing to summarise: no runs")
    whole = _with_splits(runs)
    kept = [[r for r in run if MISLEADING not in r.tags] for run in runs]
    if not kept[0] or len(kept[0]) == len(runs[0]):
        return whole
    return replace(whole, without_misleading=_with_splits(kept))


def _with_splits(runs: Sequence[Sequence[Record]]) -> Summary:
    summary = _summarise(runs)
    sides = sorted({record.split for record in runs[0]})
    if len(sides) < 2:
        return summary
    splits = {
        side: _summarise([[r for r in run if r.split == side] for run in runs]) for side in sides
    }
    return replace(summary, splits=splits)


def _summarise(runs: Sequence[Sequence[Record]]) -> Summary:
    scored = [score(run) for run in runs]
    rows = list(scored[0])
    metrics = {
        row: {name: _spread([s[row].values()[name] for s in scored]) for name in METRICS}
        for row in rows
    }
    first: dict[str, Record] = {}
    missed: dict[str, int] = defaultdict(int)
    for run in runs:
        for record in run:
            if record.misses:
                missed[record.case_id] += 1
                first.setdefault(record.case_id, record)
    misses = tuple(
        CaseMiss(
            r.case_id,
            r.cls,
            r.source,
            r.expected,
            r.got,
            r.misses,
            missed[r.case_id],
            len(runs),
            r.split,
            r.outcome,
        )
        for r in sorted(first.values(), key=lambda r: (r.cls, r.case_id))
    )
    return Summary(len(runs), {row: scored[0][row].cases for row in rows}, metrics, misses)


def gate(summary: Summary, floors: Floors) -> list[str]:
    """Why the evaluation fails (empty: it passes). Any false cordon in any run fails it; each
    accuracy floor is checked against the mean over runs, in total and on each split that has
    floors of its own."""
    reasons = []
    cordons = summary.metrics[TOTAL]["false_cordons"]
    if cordons is not None and cordons.max > 0:
        reasons.append(f"{cordons.max:.0f} false cordon(s): a healthy node would be cordoned")
    reasons.extend(_below(summary, floors, ""))
    for side, side_floors in sorted(floors.splits.items()):
        side_summary = summary.splits.get(side)
        if side_summary is None:
            reasons.append(f"{side}: floors set, but no case is on the {side} split")
            continue
        reasons.extend(_below(side_summary, side_floors, f"{side} "))
    return reasons


def _below(summary: Summary, floors: Floors, prefix: str) -> list[str]:
    reasons = []
    total = summary.metrics[TOTAL]
    for name, floor in (
        ("action_accuracy", floors.action),
        ("category_accuracy", floors.category),
        ("culprit_accuracy", floors.culprit),
    ):
        value = total[name]
        if floor is not None and value is not None and value.mean < floor:
            reasons.append(f"{prefix}{name} {value.mean:.3f} is below its floor {floor:.3f}")
    return reasons
