"""Where the Loghub-2k ground truth lives: `../shared/data/loghub-2k` beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import missing_service

ROOT = Path(__file__).resolve().parents[2]
_CANDIDATES = (
    ROOT.parent / "shared" / "data" / "loghub-2k",
    # A git worktree one level further down (`<work>/wt/<name>`) shares the same data.
    ROOT.parents[1] / "shared" / "data" / "loghub-2k",
)


@pytest.fixture(scope="session")
def loghub_dir() -> Path:
    for path in _CANDIDATES:
        if (path / "HDFS").is_dir():
            return path
    missing_service(f"Loghub-2k data not found at {_CANDIDATES[0]}")
