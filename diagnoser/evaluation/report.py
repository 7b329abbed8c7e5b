"""Print a `Summary`: a rich table per class and a list of misses, or one JSON object.

The held-back `test` split is read as aggregates only (evals/README.md): its cases are never
listed one by one unless the caller opts in (`diagnoser eval --show-test-cases`), so that
looking at a score cannot turn into reading the test logs a rule must not be written from."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from diagnoser.evaluation.scoring import METRICS, TOTAL, CaseMiss, Labels, Spread, Summary

HEADERS = {
    "action_accuracy": "action",
    "category_accuracy": "category",
    "culprit_accuracy": "culprit",
    "false_cordons": "false cordons",
    "missed_cordons": "missed cordons",
    "inconclusive_rate": "inconclusive",
    "silent_misses": "silent",
    "deferrals": "deferred",
    "wrong_answers": "wrong",
    "benign_silence": "benign silent",
}
COUNTS = frozenset(
    {"false_cordons", "missed_cordons", "silent_misses", "deferrals", "wrong_answers"}
)
SIDES = ("dev", "test")
HELD_BACK = "test"
"""The split whose cases are scored but not listed by default."""


def listed_misses(summary: Summary, show_test_cases: bool) -> tuple[CaseMiss, ...]:
    """The misses a report may name: every one with the opt-in, else those off the test split."""
    if show_test_cases:
        return summary.misses
    return tuple(miss for miss in summary.misses if miss.split != HELD_BACK)


def _cell(name: str, value: Spread | None, runs: int) -> str:
    if value is None:
        return "-"
    fmt = "{:.0f}" if name in COUNTS and runs == 1 else "{:.2f}"
    text = fmt.format(value.mean)
    if runs > 1:
        text += f" ±{value.stdev:.2f} [{value.min:.2f}-{value.max:.2f}]"
    return text


def _labels(labels: Labels) -> str:
    nodes = f" @{','.join(labels.culprit_nodes)}" if labels.culprit_nodes else ""
    category = labels.category.value if labels.category else "-"
    return f"{labels.action.value} / {category} / {labels.failure_type}{nodes}"


def _table(summary: Summary, title: str) -> Table:
    table = Table("class", "cases", *(HEADERS[name] for name in METRICS), title=title)
    for row, metrics in summary.metrics.items():
        cells = [_cell(name, metrics[name], summary.runs) for name in METRICS]
        if row == TOTAL:
            table.add_section()
            table.add_row(f"[bold]{row}[/]", str(summary.cases[row]), *cells, style="bold")
        else:
            table.add_row(escape(row), str(summary.cases[row]), *cells)
    return table


def _side_by_side(summary: Summary) -> Table:
    """One row per class, each cell `dev / test`: the gap is read across, not between tables."""
    sides = [summary.splits[side] for side in SIDES]
    table = Table("class", "cases", *(HEADERS[name] for name in METRICS), title="dev / test")
    for row in summary.metrics:
        cases = " / ".join(str(side.cases.get(row, 0)) for side in sides)
        cells = [
            " / ".join(
                _cell(name, side.metrics[row][name] if row in side.metrics else None, 1)
                for side in sides
            )
            for name in METRICS
        ]
        if row == TOTAL:
            table.add_section()
            table.add_row(f"[bold]{row}[/]", cases, *cells, style="bold")
        else:
            table.add_row(escape(row), cases, *cells)
    return table


def render(
    summary: Summary, failures: list[str], console: Console, *, show_test_cases: bool = False
) -> None:
    title = "diagnosis evaluation"
    if summary.runs > 1:
        title += escape(f" (mean ±stdev [min-max] over {summary.runs} runs)")
    split = all(side in summary.splits for side in SIDES)
    if split and summary.runs == 1:
        console.print(_side_by_side(summary))
    elif split:
        for side in SIDES:
            console.print(_table(summary.splits[side], f"{title}: {side}"))
    else:
        console.print(_table(summary, title))
    if split:
        line = f"all {summary.cases[TOTAL]} cases: " + _accuracies(
            summary, ("action_accuracy", "category_accuracy", "culprit_accuracy"), summary.runs
        )
        gap = summary.gap()
        console.print(escape(line))
        if gap is not None:
            console.print(f"dev-test gap on action: {gap:+.2f}")
        if summary.without_misleading is not None:
            console.print(escape(_without_misleading_line(summary, summary.without_misleading)))
    misses = listed_misses(summary, show_test_cases)
    hidden = len(summary.misses) - len(misses)
    if misses:
        console.print(f"\n[bold]misses[/] ({len(misses)})")
        for miss in misses:
            runs = f" in {miss.runs_missed}/{miss.runs} runs" if miss.runs > 1 else ""
            kinds = ", ".join(kind.value for kind in miss.kinds)
            console.print(
                f"[bold]{escape(miss.case_id)}[/] ({escape(miss.cls)}, {miss.split}; "
                f"{miss.outcome.value}: {kinds}{runs})\n"
                f"  expected {escape(_labels(miss.expected))}\n"
                f"  got      {escape(_labels(miss.got))}\n"
                f"  source   {escape(miss.source)}"
            )
    if hidden:
        console.print(
            f"{hidden} {HELD_BACK} miss(es) not listed: the {HELD_BACK} split is read as the "
            "aggregates above (--show-test-cases lists them)"
        )
    if failures:
        for reason in failures:
            console.print(f"[bold red]FAIL[/] {escape(reason)}")
    else:
        console.print("[bold green]PASS[/]")


def _accuracies(part: Summary, names: tuple[str, ...], runs: int) -> str:
    """`action 0.92, category 0.94`: the total row's accuracies, for the lines under a table."""
    total = part.metrics[TOTAL]
    return ", ".join(f"{HEADERS[name]} {_cell(name, total[name], runs)}" for name in names)


def _without_misleading_line(summary: Summary, kept: Summary) -> str:
    """The scores without the cases whose log points at another cause (tag `misleading`)."""
    tagged = summary.cases[TOTAL] - kept.cases[TOTAL]
    sides = [
        f"{side} ({kept.splits[side].cases[TOTAL]}) "
        + _accuracies(kept.splits[side], ("action_accuracy", "category_accuracy"), summary.runs)
        for side in SIDES
        if side in kept.splits
    ]
    line = f"without the {tagged} cases tagged misleading: " + "; ".join(sides)
    gap = kept.gap()
    return line + (f"; gap on action {gap:+.2f}" if gap is not None else "")


def _spread_json(value: Spread | None) -> dict[str, float] | None:
    if value is None:
        return None
    return {k: round(v, 4) for k, v in (("mean", value.mean), ("stdev", value.stdev),
                                         ("min", value.min), ("max", value.max))}  # fmt: skip


def _labels_json(labels: Labels) -> dict[str, Any]:
    return {
        "status": labels.status.value,
        "category": labels.category.value if labels.category else None,
        "failure_type": labels.failure_type,
        "action": labels.action.value,
        "culprit_nodes": list(labels.culprit_nodes),
    }


def _miss_json(miss: CaseMiss) -> dict[str, Any]:
    return {
        "case": miss.case_id,
        "class": miss.cls,
        "source": miss.source,
        "kinds": [kind.value for kind in miss.kinds],
        "runs_missed": miss.runs_missed,
        "split": miss.split,
        "outcome": miss.outcome.value,
        "expected": _labels_json(miss.expected),
        "got": _labels_json(miss.got),
    }


def as_json(
    summary: Summary, failures: list[str], *, show_test_cases: bool = False
) -> dict[str, Any]:
    """The stable `eval --json` shape: every metric as {mean, stdev, min, max} (or null).

    `total` and `classes` are over every case, as before the split; `splits` holds the same
    `total` and `classes` per side, and `gap` dev minus test. `without_misleading` holds the
    same `total`, `splits` and `gap` over the cases not tagged `misleading` (null when no case
    or every case is). `misses` lists the cases off the test split only, unless
    `show_test_cases`; `test_misses_hidden` counts the ones left out."""

    def row(part: Summary, name: str) -> dict[str, Any]:
        metrics = part.metrics[name]
        return {"cases": part.cases[name]} | {m: _spread_json(metrics[m]) for m in METRICS}

    def rows(part: Summary) -> dict[str, Any]:
        return {
            "total": row(part, TOTAL),
            "classes": {name: row(part, name) for name in part.metrics if name != TOTAL},
        }

    def gaps(part: Summary) -> dict[str, float | None]:
        return {
            metric: None if (value := part.gap(metric)) is None else round(value, 4)
            for metric in ("action_accuracy", "category_accuracy", "culprit_accuracy")
        }

    def without_misleading(part: Summary) -> dict[str, Any]:
        return {
            "total": row(part, TOTAL),
            "splits": {side: {"total": row(s, TOTAL)} for side, s in part.splits.items()},
            "gap": gaps(part),
        }

    misses = listed_misses(summary, show_test_cases)
    return {
        "runs": summary.runs,
        "passed": not failures,
        "failures": failures,
        **rows(summary),
        "misses": [_miss_json(miss) for miss in misses],
        "test_cases_shown": show_test_cases,
        "test_misses_hidden": len(summary.misses) - len(misses),
        "splits": {side: rows(part) for side, part in summary.splits.items()},
        "gap": gaps(summary),
        "without_misleading": None
        if summary.without_misleading is None
        else without_misleading(summary.without_misleading),
    }
