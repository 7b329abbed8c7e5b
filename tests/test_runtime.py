"""The serving process's garbage-collector tuning, checked in fresh interpreters (it is
process-wide and done once, so the test process itself is left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

PROBE = """
import gc, json
from diagnoser.config import Settings
from diagnoser.runtime import tune_gc
before = gc.get_threshold()
first = tune_gc(Settings().gc_thresholds)
frozen = gc.get_freeze_count()
again = tune_gc((1, 1, 1))
print(json.dumps({"before": before, "after": gc.get_threshold(), "first": first,
                  "again": again, "frozen": frozen}))
"""


def _probe(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env={**clean, **env},
        check=True,
    )
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def test_the_start_up_heap_is_frozen_and_young_collections_are_rarer() -> None:
    seen = _probe()
    assert seen["first"] is True
    assert seen["again"] is False  # once per process: a later call changes nothing
    assert seen["frozen"] > 10_000  # the imported modules and settings, at least
    assert seen["after"] == [1000, 10, 100]


def test_the_thresholds_are_a_setting() -> None:
    seen = _probe(DIAGNOSER_GC_THRESHOLDS="[700, 10, 10]")
    assert seen["after"] == seen["before"] == [700, 10, 10]
    assert seen["frozen"] > 0
