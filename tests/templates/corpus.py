"""Shared inputs of the compression tests: the shipped rule pack, loghub-2k, the fixture logs."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from diagnoser.rules import RuleSet, load_dir

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"
FIXTURES_DIR = ROOT / "tests" / "fixtures" / "logs"
LOGHUB_CANDIDATES = (
    *([Path(os.environ["DIAGNOSER_LOGHUB_DIR"])] if os.environ.get("DIAGNOSER_LOGHUB_DIR") else []),
    ROOT.parent / "shared" / "data" / "loghub-2k",
    ROOT.parents[1] / "shared" / "data" / "loghub-2k",  # a worktree one level further down
    Path("/work/shared/data/loghub-2k"),  # the team machines' copy, for a clone elsewhere
)
LOGHUB = next((p for p in LOGHUB_CANDIDATES if (p / "HDFS").is_dir()), LOGHUB_CANDIDATES[0])
"""Loghub's 2k-line samples (Zhu et al., ISSRE'23; see its CITATION), read in place."""


@cache
def pack(engine: str = "auto") -> RuleSet:
    return load_dir(RULES_DIR, prefilter="regex" if engine == "regex" else "auto")


def loghub_datasets() -> list[Path]:
    return sorted(LOGHUB.glob("*/*_2k.log"))


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()
