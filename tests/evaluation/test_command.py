"""The CI regression gate: the shipped corpus, scored end to end in a subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from diagnoser.evaluation.corpus import load_corpus
from tests.servers import run_diagnoser

ROOT = Path(__file__).resolve().parents[2]


def evaluate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_diagnoser("eval", *args, cwd=ROOT)


def test_the_shipped_corpus_passes_its_floors_without_a_false_cordon() -> None:
    result = evaluate("evals/", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True
    assert report["total"]["false_cordons"]["max"] == 0
    assert report["total"]["cases"] >= 150
    assert report["runs"] == 1


def test_repeat_reports_zero_spread_on_the_rules_path() -> None:
    result = evaluate("evals/", "--json", "--repeat", "2")
    report = json.loads(result.stdout)
    for metric in ("action_accuracy", "category_accuracy", "culprit_accuracy"):
        assert report["total"][metric]["stdev"] == 0
    assert report["runs"] == 2


def test_the_table_names_every_class_and_the_misses() -> None:
    result = evaluate("evals/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "total" in result.stdout
    assert "multi_node" in result.stdout
    assert "PASS" in result.stdout


def test_a_broken_corpus_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    case = tmp_path / "cases" / "bad"
    case.mkdir(parents=True)
    (case / "node-0.log").write_text("hello\n")
    (case / "case.yaml").write_text(
        "id: bad\nclass: x\nsplit: dev\nsource: s\nexpected: {status: failure, category: hardware, "
        "failure_type: gpu_lost, action: cordon, culprit_nodes: []}\n"
    )
    result = evaluate(str(tmp_path))
    assert result.returncode == 2
    assert "expected.action" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_floor_above_reach_fails_the_gate(tmp_path: Path) -> None:
    (tmp_path / "cases").symlink_to(ROOT / "evals" / "cases")
    (tmp_path / "floors.yaml").write_text("action: 1.0\n")
    result = evaluate(str(tmp_path), "--json")
    assert result.returncode == 1
    assert any("action_accuracy" in f for f in json.loads(result.stdout)["failures"])


def test_without_the_reported_stalls_the_hangs_are_missed_and_nothing_else_changes() -> None:
    with_stalls = json.loads(evaluate("evals/", "--json").stdout)
    text_only = json.loads(evaluate("evals/", "--json", "--no-stalls").stdout)
    hang = with_stalls["classes"]["hang"]
    # Every hang is found once its stall is known (held-back cases whose label names another
    # action score as wrong answers, never as silent ones); none from the text alone.
    assert hang["silent_misses"]["mean"] == 0
    assert text_only["classes"]["hang"]["action_accuracy"]["mean"] == 0.0
    assert hang["action_accuracy"]["mean"] > 0.5
    for name, row in with_stalls["classes"].items():
        if name != "hang":
            assert row == text_only["classes"][name], name


def test_dev_and_test_are_reported_side_by_side_with_the_gap() -> None:
    report = json.loads(evaluate("evals/", "--json").stdout)
    dev, test = report["splits"]["dev"], report["splits"]["test"]
    assert dev["total"]["cases"] + test["total"]["cases"] == report["total"]["cases"]
    assert test["total"]["cases"] * 3 >= report["total"]["cases"]
    assert set(test["classes"]) == set(report["classes"])  # every class has test cases
    gap = dev["total"]["action_accuracy"]["mean"] - test["total"]["action_accuracy"]["mean"]
    assert report["gap"]["action_accuracy"] == pytest.approx(gap, abs=1e-3)
    for row in (dev["total"], test["total"], report["total"]):
        for metric in ("silent_misses", "deferrals", "wrong_answers", "benign_silence"):
            assert metric in row
    assert test["total"]["false_cordons"]["max"] == 0
    assert all(miss["split"] == "dev" for miss in report["misses"])
    table = evaluate("evals/").stdout
    assert "dev / test" in table
    assert "dev-test gap on action" in table


def test_the_cases_tagged_misleading_are_scored_apart_as_well() -> None:
    cases = load_corpus(ROOT / "evals")
    plain = {
        side: sum(1 for c in cases if c.split.value == side and "misleading" not in c.tags)
        for side in ("dev", "test")
    }
    report = json.loads(evaluate("evals/", "--json").stdout)["without_misleading"]
    assert {side: report["splits"][side]["total"]["cases"] for side in plain} == plain
    assert 0 < sum(plain.values()) < len(cases)
    assert report["splits"]["test"]["total"]["false_cordons"]["max"] == 0
    assert "cases tagged misleading" in evaluate("evals/").stdout


def test_a_test_floor_above_reach_fails_the_gate(tmp_path: Path) -> None:
    (tmp_path / "cases").symlink_to(ROOT / "evals" / "cases")
    (tmp_path / "floors.yaml").write_text("test:\n  category: 1.0\n")
    result = evaluate(str(tmp_path), "--json")
    assert result.returncode == 1
    failures = json.loads(result.stdout)["failures"]
    assert any(f.startswith("test category_accuracy") for f in failures)


def test_the_score_does_not_depend_on_the_shells_hang_settings() -> None:
    env = {"DIAGNOSER_HANG__ACTION": "escalate", "DIAGNOSER_HANG__TIMEOUT_S": "999999"}
    report = json.loads(run_diagnoser("eval", "evals/", "--json", env=env, cwd=ROOT).stdout)
    default = json.loads(evaluate("evals/", "--json").stdout)
    assert report["classes"]["hang"] == default["classes"]["hang"]
    assert report["classes"]["hang"]["silent_misses"]["mean"] == 0


def test_the_test_split_is_aggregates_only_unless_asked() -> None:
    """The held-back cases are never named by default, in the table or the JSON; the count of
    the ones left out is (so the opt-in is known to exist)."""
    opted_in = json.loads(evaluate("evals/", "--json", "--show-test-cases").stdout)
    held_back = {m["case"] for m in opted_in["misses"] if m["split"] == "test"}
    assert held_back, "the shipped corpus has test misses to hide"
    default = json.loads(evaluate("evals/", "--json").stdout)
    assert default["test_misses_hidden"] == len(held_back)
    assert default["splits"] == opted_in["splits"]
    table = evaluate("evals/").stdout
    named = sum(case in table or case in json.dumps(default) for case in held_back)
    assert named == 0
