"""Where the Loghub-2k ground truth lives (tests/templates/corpus.py): missing fails in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import missing_service
from tests.templates.corpus import LOGHUB, LOGHUB_CANDIDATES


@pytest.fixture(scope="session")
def loghub_dir() -> Path:
    if (LOGHUB / "HDFS").is_dir():
        return LOGHUB
    missing_service(
        f"Loghub-2k data not found (looked in {', '.join(map(str, LOGHUB_CANDIDATES))})"
    )
