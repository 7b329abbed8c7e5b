"""The report names dev misses one by one and the held-back test split only in aggregate."""

from __future__ import annotations

import io

from rich.console import Console

from diagnoser.diagnosis.correlate import Status
from diagnoser.evaluation.report import as_json, render
from diagnoser.evaluation.scoring import Labels, Record, Summary, summarise
from diagnoser.rules import Action, Category

OOM = Labels(Status.FAILURE, Category.RESOURCE, "cuda_oom", Action.NOTIFY_USER)
HEALTHY = Labels(Status.HEALTHY, None, "healthy", Action.NONE)


def summary_with_a_miss_on_each_side() -> Summary:
    run = [
        Record("dev-miss", "cuda_oom", "https://example.org/dev", OOM, HEALTHY, "dev"),
        Record("dev-right", "cuda_oom", "https://example.org/dev2", OOM, OOM, "dev"),
        Record("held-back-miss", "cuda_oom", "https://example.org/test", OOM, HEALTHY, "test"),
        Record("held-back-right", "cuda_oom", "https://example.org/test2", OOM, OOM, "test"),
    ]
    return summarise([run])


def rendered(show_test_cases: bool) -> str:
    out = io.StringIO()
    summary = summary_with_a_miss_on_each_side()
    render(summary, [], Console(file=out, width=200), show_test_cases=show_test_cases)
    return out.getvalue()


def test_the_table_lists_dev_misses_and_counts_the_test_ones() -> None:
    text = rendered(show_test_cases=False)
    assert "dev-miss" in text
    assert "held-back" not in text
    assert "example.org/test" not in text
    assert "1 test miss(es) not listed" in text
    assert "silent" in text  # the aggregates are still there, per class and in total


def test_the_table_lists_test_misses_only_when_asked() -> None:
    assert "held-back-miss" in rendered(show_test_cases=True)


def test_json_lists_no_test_case_unless_asked() -> None:
    summary = summary_with_a_miss_on_each_side()
    default = as_json(summary, [])
    assert [miss["case"] for miss in default["misses"]] == ["dev-miss"]
    assert (default["test_cases_shown"], default["test_misses_hidden"]) == (False, 1)
    assert "held-back" not in str(default)
    assert default["splits"]["test"]["total"]["silent_misses"]["mean"] == 1
    opted_in = as_json(summary, [], show_test_cases=True)
    assert [miss["case"] for miss in opted_in["misses"]] == ["dev-miss", "held-back-miss"]
    assert opted_in["test_misses_hidden"] == 0


def summary_with_a_misleading_miss() -> Summary:
    run = [
        Record("dev-right", "cuda_oom", "https://example.org/a", OOM, OOM, "dev"),
        Record("dev-misled", "cuda_oom", "https://example.org/b", OOM, HEALTHY, "dev",
               ("misleading",)),
        Record("held-back-right", "cuda_oom", "https://example.org/c", OOM, OOM, "test"),
        Record("held-back-miss", "cuda_oom", "https://example.org/d", OOM, HEALTHY, "test"),
    ]  # fmt: skip
    return summarise([run])


def test_the_scores_without_the_misleading_cases_are_printed_beside_the_gap() -> None:
    out = io.StringIO()
    render(summary_with_a_misleading_miss(), [], Console(file=out, width=200))
    assert (
        "without the 1 cases tagged misleading: dev (1) action 1.00, category 1.00; "
        "test (2) action 0.50, category 0.50; gap on action +0.50"
    ) in out.getvalue()


def test_json_carries_the_scores_without_the_misleading_cases() -> None:
    result = as_json(summary_with_a_misleading_miss(), [])
    plain = result["without_misleading"]
    assert plain["total"]["cases"] == 3
    assert plain["splits"]["dev"]["total"]["action_accuracy"]["mean"] == 1.0
    assert plain["splits"]["test"]["total"]["silent_misses"]["mean"] == 1
    assert plain["gap"]["action_accuracy"] == 0.5
    assert result["gap"]["action_accuracy"] == 0.0
    assert as_json(summary_with_a_miss_on_each_side(), [])["without_misleading"] is None
