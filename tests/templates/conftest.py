"""Where the Loghub-2k ground truth lives: `../shared/data/loghub-2k` beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    message = f"Loghub-2k data not found at {_CANDIDATES[0]}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (required in CI)")
    pytest.skip(message)
