"""Whole public training logs: every failure line survives compression as `diagnoser compress` runs.

The logs and their sources are in `bench/data/real-logs/` (see `PROVENANCE.md` there).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnoser.rules import RuleSet
from diagnoser.templates.command import read_batches
from diagnoser.templates.compressor import Compressor, JobLog
from diagnoser.templates.guard import FAILURE_PATTERNS, Guard, GuardState
from tests.templates.corpus import pack

REAL_LOGS = Path(__file__).resolve().parents[2] / "bench" / "data" / "real-logs"
LOGS = sorted(REAL_LOGS.glob("*.log"))
FAMILY = ("random-ltd-gpt2-base-run1.log", "random-ltd-gpt2-medium-run2.log")
WORDS = [
    re.compile(p, re.ASCII | (re.IGNORECASE if caseless else 0)) for p, caseless in FAILURE_PATTERNS
]


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return pack()


def _lines(path: Path) -> list[str]:
    return [line for batch in read_batches(path) for line in batch]


def _compress(compressor: Compressor, path: Path) -> JobLog:
    job = compressor.job()
    for batch in read_batches(path):
        job.feed(batch)
    return job.finish()


def _failure_lines(ruleset: RuleSet, lines: list[str]) -> set[int]:
    """Failure-word lines by the stdlib `re` alone, plus every line a fresh guard marks."""
    words = {n for n, line in enumerate(lines, 1) if any(p.search(line) for p in WORDS)}
    guarded = {i + 1 for i in Guard(ruleset).scan(lines, GuardState())}
    return words | guarded


def test_real_logs_are_committed() -> None:
    assert len(LOGS) == 6
    assert all(path.stat().st_size < 1_000_000 for path in LOGS)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_every_failure_line_of_a_real_log_is_kept(ruleset: RuleSet, path: Path) -> None:
    lines = _lines(path)
    compressor = Compressor(ruleset)
    log = _compress(compressor, path)
    kept = {k.line_no for k in log.kept}
    failures = _failure_lines(ruleset, lines)
    missing = [(n, lines[n - 1]) for n in sorted(failures - kept)]
    assert missing == []
    # Not vacuous: the log has failure lines and the compressor filtered something.
    assert failures
    assert compressor.filters.enabled
    assert log.lines_kept < len(lines)


def test_second_job_of_a_family_keeps_its_failure_lines_and_fewer_others(
    ruleset: RuleSet,
) -> None:
    compressor = Compressor(ruleset)
    first = _compress(compressor, REAL_LOGS / FAMILY[0])
    second = _compress(compressor, REAL_LOGS / FAMILY[1])
    lines = _lines(REAL_LOGS / FAMILY[1])
    kept = {k.line_no for k in second.kept}
    assert _failure_lines(ruleset, lines) <= kept
    # The second job starts with the first one's filters.
    assert second.lines_kept < first.lines_kept


def test_a_config_dump_is_filtered_after_a_few_lines(ruleset: RuleSet) -> None:
    """random-LTD's DeepSpeed config dump (`[INFO] [config.py:999:print]   name .... value`,
    55 lines, each setting once) kept 48 of its lines when each setting was its own template."""
    path = REAL_LOGS / "random-ltd-gpt2-base-run1.log"
    lines = _lines(path)
    log = _compress(Compressor(ruleset), path)
    kept = {k.line_no for k in log.kept}
    dump = [n for n, line in enumerate(lines, 1) if re.search(r" \.{4,} ", line)]
    assert len(dump) == 55
    assert sum(n in kept for n in dump) <= 16


def test_an_argument_dump_naming_nccl_is_filtered(ruleset: RuleSet) -> None:
    """Megatron's argument dump holds `distributed_backend .... nccl`: the bus-error rule's
    anchor was ` nccl`, so the guard kept that line, the dump's filter was disabled on the spot
    and the remaining ~600 settings were kept. The anchor is an NCCL function name now."""
    path = REAL_LOGS / "megatron-rl-refit-gloo.log"
    lines = _lines(path)
    compressor = Compressor(ruleset)
    log = _compress(compressor, path)
    kept = {k.line_no for k in log.kept}
    dump = [n for n, line in enumerate(lines, 1) if re.search(r" \.{4,} ", line)]
    assert any(lines[n - 1].split()[0] == "distributed_backend" for n in dump)
    assert len(dump) > 500
    assert sum(n in kept for n in dump) < 50
    assert compressor.filters.disabled == []
