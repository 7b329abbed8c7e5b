"""Corpus loading: every problem is reported with its file and field, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Status
from diagnoser.evaluation.corpus import CorpusError, load_corpus, load_floors
from diagnoser.evaluation.scoring import Floors
from diagnoser.rules import Action, Category

GOOD = """\
id: {id}
class: gpu_lost
split: test
source: https://github.com/example/repo/issues/1
tags: [truncated]
expected:
  status: failure
  category: hardware
  failure_type: gpu_lost
  action: {action}
  culprit_nodes: [{nodes}]
note: >
  A made-up case for the loader tests.
"""


def write_case(
    root: Path, case_id: str, action: str = "cordon_node_and_restart", nodes: str = "node-1"
) -> Path:
    folder = root / "cases" / case_id
    folder.mkdir(parents=True)
    (folder / "case.yaml").write_text(GOOD.format(id=case_id, action=action, nodes=nodes))
    (folder / "node-1.log").write_text(
        "RuntimeError: CUDA error: no CUDA-capable device is detected\n"
    )
    return folder


def test_loads_a_case(tmp_path: Path) -> None:
    write_case(tmp_path, "gpu-lost-1")
    (case,) = load_corpus(tmp_path)
    assert case.id == "gpu-lost-1"
    assert case.cls == "gpu_lost"
    assert case.sources == ("https://github.com/example/repo/issues/1",)
    assert case.expected.status is Status.FAILURE
    assert case.expected.category is Category.HARDWARE
    assert case.expected.action is Action.CORDON_NODE_AND_RESTART
    assert case.expected.culprit_nodes == ("node-1",)
    assert [p.name for p in case.logs] == ["node-1.log"]


def test_a_directory_of_cases_is_accepted_as_is(tmp_path: Path) -> None:
    write_case(tmp_path, "gpu-lost-1")
    assert len(load_corpus(tmp_path / "cases")) == 1


def test_a_bad_action_name_is_reported_clearly(tmp_path: Path) -> None:
    write_case(tmp_path, "bad-action", action="cordon")
    with pytest.raises(CorpusError) as caught:
        load_corpus(tmp_path)
    (problem,) = caught.value.problems
    assert str(tmp_path / "cases" / "bad-action" / "case.yaml") in problem
    assert "expected.action" in problem
    assert "'cordon'" in problem
    assert "cordon_node_and_restart" in problem


def test_every_problem_is_reported_together(tmp_path: Path) -> None:
    write_case(tmp_path, "bad-action", action="reboot")
    write_case(tmp_path, "bad-node", nodes="node-9")
    folder = write_case(tmp_path, "wrong-id")
    (folder / "case.yaml").write_text(GOOD.format(id="other", action="none", nodes=""))
    empty = tmp_path / "cases" / "no-logs"
    empty.mkdir()
    (empty / "case.yaml").write_text(GOOD.format(id="no-logs", action="none", nodes=""))
    broken = tmp_path / "cases" / "broken-yaml"
    broken.mkdir()
    (broken / "case.yaml").write_text("id: [unclosed\n")
    with pytest.raises(CorpusError) as caught:
        load_corpus(tmp_path)
    text = "\n".join(caught.value.problems)
    assert "bad-action/case.yaml: expected.action" in text
    assert "expected.culprit_nodes: node-9 not among the node logs (node-1)" in text
    assert "id: 'other' differs from its directory 'wrong-id'" in text
    assert "no-logs: no .log file" in text
    assert "broken-yaml/case.yaml: not valid YAML" in text


def test_unknown_keys_are_refused(tmp_path: Path) -> None:
    folder = write_case(tmp_path, "extra")
    path = folder / "case.yaml"
    path.write_text(path.read_text() + "verdict: cordon\n")
    with pytest.raises(CorpusError, match="verdict: Extra inputs are not permitted"):
        load_corpus(tmp_path)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not a directory"):
        load_corpus(tmp_path / "nowhere")


def test_floors(tmp_path: Path) -> None:
    assert load_floors(tmp_path / "floors.yaml") == Floors()
    path = tmp_path / "floors.yaml"
    path.write_text("action: 0.8\ncategory: 0.85\nculprit: 0.9\n")
    assert load_floors(path) == Floors(0.8, 0.85, 0.9)
    path.write_text("action: 1.5\n")
    with pytest.raises(CorpusError, match="action: Input should be less than or equal to 1"):
        load_floors(path)


def test_an_observed_stall_is_read_with_its_quote(tmp_path: Path) -> None:
    folder = write_case(tmp_path, "hang-1")
    text = (folder / "case.yaml").read_text()
    observed = (
        "observed:\n  stalled: true\n  stalled_for_s: 3600\n  quote: 'hangs (1 hour already)'\n"
    )
    (folder / "case.yaml").write_text(text.replace("note: >", observed + "note: >"))
    (case,) = load_corpus(tmp_path)
    assert (case.stalled, case.stalled_for) == (True, 3600)


def test_an_observed_stall_without_a_quote_is_refused(tmp_path: Path) -> None:
    folder = write_case(tmp_path, "hang-1")
    text = (folder / "case.yaml").read_text()
    observed = "observed:\n  stalled: true\n  stalled_for_s: null\n"
    (folder / "case.yaml").write_text(text.replace("note: >", observed + "note: >"))
    with pytest.raises(CorpusError) as caught:
        load_corpus(tmp_path)
    assert any("observed.quote" in p for p in caught.value.problems)


def test_a_case_without_a_split_is_refused(tmp_path: Path) -> None:
    folder = write_case(tmp_path, "gpu-lost-1")
    text = (folder / "case.yaml").read_text()
    (folder / "case.yaml").write_text(text.replace("split: test\n", ""))
    with pytest.raises(CorpusError) as caught:
        load_corpus(tmp_path)
    assert any("split: Field required" in p for p in caught.value.problems)
    (folder / "case.yaml").write_text(text.replace("split: test", "split: train"))
    with pytest.raises(CorpusError) as caught:
        load_corpus(tmp_path)
    assert any("split: Input should be 'dev' or 'test'" in p for p in caught.value.problems)


def test_floors_per_split(tmp_path: Path) -> None:
    path = tmp_path / "floors.yaml"
    path.write_text("action: 0.8\ndev: {action: 0.9}\ntest: {action: 0.7, category: 0.75}\n")
    assert load_floors(path) == Floors(0.8, splits={"dev": Floors(0.9), "test": Floors(0.7, 0.75)})
    path.write_text("train: {action: 0.9}\n")
    with pytest.raises(CorpusError, match="train: Extra inputs are not permitted"):
        load_floors(path)
