"""Scoring is pure: hand-made (expected, got) records in, metrics out."""

from __future__ import annotations

import pytest

from diagnoser.diagnosis.correlate import Status
from diagnoser.evaluation.scoring import (
    TOTAL,
    Floors,
    Labels,
    Miss,
    Outcome,
    Record,
    Spread,
    gate,
    score,
    summarise,
)
from diagnoser.rules import Action, Category

CORDON = Action.CORDON_NODE_AND_RESTART
HEALTHY = Labels(Status.HEALTHY, None, "healthy", Action.NONE)


def labels(action: Action, category: Category | None = Category.HARDWARE, *nodes: str) -> Labels:
    status = {
        Action.NONE: Status.HEALTHY,
        Action.ESCALATE: Status.INCONCLUSIVE,
    }.get(action, Status.FAILURE)
    return Labels(status, category, "x", action, tuple(nodes))


def record(expected: Labels, got: Labels, cls: str = "c", case: str = "case") -> Record:
    return Record(case, cls, "https://example.org/issue", expected, got)


def test_a_correct_cordon_counts_everywhere() -> None:
    r = record(labels(CORDON, Category.HARDWARE, "n1"), labels(CORDON, Category.HARDWARE, "n1"))
    assert (r.action_ok, r.category_ok, r.culprit_ok) == (True, True, True)
    assert not r.false_cordon
    assert not r.missed_cordon
    assert r.misses == ()


HW1 = labels(CORDON, Category.HARDWARE, "n1")
RESTART = labels(Action.RESTART_JOB, Category.NETWORK)


@pytest.mark.parametrize(
    ("expected", "got", "false_cordon", "missed_cordon"),
    [
        (RESTART, HW1, True, False),
        (HEALTHY, HW1, True, False),
        (HW1, labels(CORDON, Category.HARDWARE, "n2"), True, False),
        (labels(CORDON, Category.HARDWARE, "n1", "n2"), HW1, False, False),
        (HW1, labels(Action.RESTART_JOB, Category.HARDWARE, "n1"), False, True),
        (HW1, HEALTHY, False, True),
        (RESTART, labels(Action.ESCALATE, Category.NETWORK), False, False),
    ],
)
def test_false_and_missed_cordons(
    expected: Labels, got: Labels, false_cordon: bool, missed_cordon: bool
) -> None:
    r = record(expected, got)
    assert r.false_cordon is false_cordon
    assert r.missed_cordon is missed_cordon
    assert (Miss.FALSE_CORDON in r.misses) is false_cordon


def test_culprit_is_an_exact_set_match_scored_only_when_labelled() -> None:
    expected = labels(Action.NOTIFY_USER, Category.RESOURCE, "a", "b")
    assert record(expected, labels(Action.NOTIFY_USER, Category.RESOURCE, "b", "a")).culprit_ok
    assert not record(expected, labels(Action.NOTIFY_USER, Category.RESOURCE, "a")).culprit_ok
    unlabelled = labels(Action.NOTIFY_USER, Category.RESOURCE)
    assert record(unlabelled, labels(Action.NOTIFY_USER, Category.RESOURCE, "x")).culprit_ok is None


def test_score_per_class_and_total() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    records = [
        record(hw, hw, "gpu", "a"),
        record(hw, labels(Action.RESTART_JOB, Category.HARDWARE, "n1"), "gpu", "b"),
        record(HEALTHY, HEALTHY, "benign", "c"),
        record(HEALTHY, labels(Action.ESCALATE, Category.FRAMEWORK), "benign", "d"),
    ]
    scores = score(records)
    assert list(scores) == ["benign", "gpu", TOTAL]
    gpu = scores["gpu"].values()
    assert gpu["action_accuracy"] == 0.5
    assert gpu["category_accuracy"] == 1.0
    assert gpu["culprit_accuracy"] == 1.0
    assert gpu["missed_cordons"] == 1
    benign = scores["benign"].values()
    assert benign["culprit_accuracy"] is None
    assert benign["inconclusive_rate"] == 0.5
    total = scores[TOTAL]
    assert (total.cases, total.action_correct, total.culprit_cases) == (4, 2, 2)


def test_summarise_reports_spread_over_runs() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    right = [record(hw, hw, "gpu", "a"), record(HEALTHY, HEALTHY, "benign", "b")]
    wrong = [record(hw, HEALTHY, "gpu", "a"), record(HEALTHY, HEALTHY, "benign", "b")]
    summary = summarise([right, wrong, right, right])
    action = summary.metrics[TOTAL]["action_accuracy"]
    assert action is not None
    assert (action.mean, action.min, action.max) == (0.875, 0.5, 1.0)
    assert action.stdev == pytest.approx(0.2165, abs=1e-4)
    assert summary.runs == 4
    assert [(m.case_id, m.runs_missed) for m in summary.misses] == [("a", 1)]
    assert summary.misses[0].got == HEALTHY


def test_a_deterministic_stage_has_no_spread() -> None:
    run = [record(HEALTHY, HEALTHY)]
    spread = summarise([run, run, run]).metrics[TOTAL]["action_accuracy"]
    assert spread == Spread(1.0, 0.0, 1.0, 1.0)


def test_gate_fails_on_any_false_cordon_and_on_floors() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    clean = summarise([[record(hw, hw), record(HEALTHY, HEALTHY)]])
    assert gate(clean, Floors(action=1.0, category=1.0, culprit=1.0)) == []
    cordoned = summarise([[record(HEALTHY, hw)], [record(HEALTHY, HEALTHY)]])
    assert any("false cordon" in reason for reason in gate(cordoned, Floors()))
    low = summarise([[record(hw, labels(Action.RESTART_JOB, Category.NETWORK))]])
    reasons = gate(low, Floors(action=0.9, category=0.5))
    assert len(reasons) == 2
    assert reasons[0].startswith("action_accuracy 0.000 is below its floor 0.900")


def test_nothing_to_summarise() -> None:
    with pytest.raises(ValueError, match="no runs"):
        summarise([])


def test_each_miss_is_silent_deferred_or_wrong() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    oom = labels(Action.NOTIFY_USER, Category.RESOURCE)
    assert record(hw, hw).outcome is Outcome.RIGHT
    assert record(hw, HEALTHY).outcome is Outcome.SILENT
    assert record(oom, labels(Action.ESCALATE, Category.RESOURCE)).outcome is Outcome.DEFERRED
    assert record(oom, labels(Action.RESTART_JOB, Category.RESOURCE)).outcome is Outcome.WRONG
    # right action, wrong category: still a confident wrong answer
    assert record(oom, labels(Action.NOTIFY_USER, Category.USER_CODE)).outcome is Outcome.WRONG
    # a benign log flagged with confidence is wrong; escalated, it is deferred
    assert record(HEALTHY, oom).outcome is Outcome.WRONG
    assert record(HEALTHY, labels(Action.ESCALATE)).outcome is Outcome.DEFERRED


def test_silent_misses_and_benign_silence_are_counted() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    records = [
        record(hw, HEALTHY, "gpu", "a"),
        record(hw, labels(Action.ESCALATE), "gpu", "b"),
        record(HEALTHY, HEALTHY, "benign", "c"),
        record(HEALTHY, labels(Action.ESCALATE), "benign", "d"),
    ]
    total = score(records)[TOTAL].values()
    assert (total["silent_misses"], total["deferrals"], total["wrong_answers"]) == (1, 2, 0)
    assert total["benign_silence"] == 0.5
    assert score(records)["gpu"].values()["benign_silence"] is None


def split_record(expected: Labels, got: Labels, case: str, split: str) -> Record:
    return Record(case, "c", "https://example.org/issue", expected, got, split)


def test_dev_and_test_are_summarised_apart_with_their_gap() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    run = [
        split_record(hw, hw, "a", "dev"),
        split_record(hw, hw, "b", "dev"),
        split_record(hw, hw, "c", "test"),
        split_record(hw, HEALTHY, "d", "test"),
    ]
    summary = summarise([run])
    assert set(summary.splits) == {"dev", "test"}
    assert summary.splits["dev"].cases[TOTAL] == 2
    test_action = summary.splits["test"].metrics[TOTAL]["action_accuracy"]
    assert test_action is not None
    assert test_action.mean == 0.5
    assert summary.gap() == 0.5
    assert [(m.case_id, m.split, m.outcome) for m in summary.misses] == [
        ("d", "test", Outcome.SILENT)
    ]


def test_floors_apply_to_each_split() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    summary = summarise(
        [[split_record(hw, hw, "a", "dev"), split_record(hw, HEALTHY, "b", "test")]]
    )
    floors = Floors(0.5, splits={"dev": Floors(0.9), "test": Floors(0.9)})
    assert gate(summary, floors) == ["test action_accuracy 0.000 is below its floor 0.900"]
    assert gate(summary, Floors(0.5)) == []


def test_one_split_alone_has_no_side_summaries() -> None:
    summary = summarise([[record(HEALTHY, HEALTHY)]])
    assert summary.splits == {}
    assert summary.gap() is None
    assert gate(summary, Floors(splits={"test": Floors(0.5)})) == [
        "test: floors set, but no case is on the test split"
    ]


def test_cases_tagged_misleading_are_also_scored_apart() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    misled = labels(Action.NOTIFY_USER, Category.USER_CODE)

    def tagged(case: str, split: str, got: Labels, *tags: str) -> Record:
        return Record(case, "c", "https://example.org/issue", hw, got, split, tags)

    run = [
        tagged("a", "dev", hw, "truncated"),
        tagged("b", "dev", misled, "misleading"),
        tagged("c", "test", hw),
        tagged("d", "test", misled, "misleading", "truncated"),
    ]
    summary = summarise([run])
    assert summary.gap() == 0.0
    kept = summary.without_misleading
    assert kept is not None
    assert kept.cases[TOTAL] == 2
    assert {side: part.cases[TOTAL] for side, part in kept.splits.items()} == {
        "dev": 1,
        "test": 1,
    }
    action = kept.metrics[TOTAL]["action_accuracy"]
    assert action is not None
    assert action.mean == 1.0
    assert [m.case_id for m in summary.misses] == ["b", "d"]
    assert kept.misses == ()


def test_without_a_misleading_case_there_is_no_second_summary() -> None:
    hw = labels(CORDON, Category.HARDWARE, "n1")
    assert summarise([[record(hw, hw)]]).without_misleading is None
    only = Record("a", "c", "https://example.org/issue", hw, hw, "dev", ("misleading",))
    assert summarise([[only]]).without_misleading is None
