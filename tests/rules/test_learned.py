"""Accepting a learned rule: checked with the whole pack, merged into learned.yaml, in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diagnoser.llm.suggestions import Resolution, suggest
from diagnoser.rules import RuleLoadError, load_dir
from diagnoser.rules.learned import LEARNED_FILE, add_rule
from diagnoser.rules.schema import Rule

PACK = Path(__file__).resolve().parents[2] / "rules"


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(PACK, target)
    return target


def learned(line: str, category: str = "user_code", action: str = "notify_user") -> Rule:
    resolutions = [
        Resolution(f"d{n}", f"job-{n}", line, category, action, "made_up") for n in range(3)
    ]
    offered, withheld = suggest(resolutions, after=3, min_share=0.8)
    assert withheld == []
    return offered[0].rule


FLUX = learned("FluxCapacitorError: the flux capacitor drifted out of phase")
WARP = learned("WarpCoreError: the warp core breached containment on deck 7")


def test_an_accepted_rule_joins_the_pack_and_accepting_twice_writes_once(pack: Path) -> None:
    before = load_dir(pack)
    path = add_rule(pack, FLUX)
    assert path == pack / LEARNED_FILE
    add_rule(pack, FLUX)
    add_rule(pack, WARP)
    after = load_dir(pack)
    assert {FLUX.id, WARP.id} <= set(after.by_id)
    assert len(after) == len(before) + 2
    assert after.by_id[FLUX.id].spec == FLUX, "what was written reads back as the same rule"
    assert not list(pack.glob(".*.tmp")), "no staging file left behind"


def test_a_rule_that_would_stop_another_rules_example_is_refused(pack: Path) -> None:
    # python_user_exception's own example: a line rule taking that line hides the traceback.
    greedy = learned("KeyError: 'labels'")
    with pytest.raises(RuleLoadError) as refused:
        add_rule(pack, greedy)
    assert any(p.rule_id == "python_user_exception" for p in refused.value.problems)
    assert not (pack / LEARNED_FILE).exists()


def test_a_broken_pack_is_not_written_to(pack: Path) -> None:
    (pack / "nccl.yaml").write_text("family: [unclosed\n")
    with pytest.raises(RuleLoadError):
        add_rule(pack, FLUX)
    assert not (pack / LEARNED_FILE).exists()


def test_a_learned_file_that_is_a_link_is_not_followed(pack: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("")
    (pack / LEARNED_FILE).symlink_to(outside)
    with pytest.raises(RuleLoadError, match="symbolic link"):
        add_rule(pack, FLUX)
    assert outside.read_text() == ""
