"""The invariant: a failure line is never filtered, whatever the filters learned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnoser.rules.assembly import strip_prefix
from diagnoser.templates.compressor import Compressor, CompressorConfig, JobLog
from diagnoser.templates.filters import Filter, Proposer
from diagnoser.templates.guard import Guard, GuardReason, GuardState
from tests.templates.corpus import FIXTURES_DIR, loghub_datasets, pack, read_lines

ORACLE = re.compile(
    r"(?i)\b(?:error|errors|exception|traceback|fatal|fail|failed|failure|killed|timeout|"
    r"timed out|xid|oom|segfault|segmentation fault|abort|aborted|panic)\b|NCCL WARN"
    r"|[a-z](?-i:Error|Exception)|[:=]\s*(?:nan|inf)\b"
)
"""An independent, plainer spelling of the issue's failure words: every line it finds is kept."""


def _compress_twice(lines: list[str], batch: int = 1024) -> tuple[Compressor, JobLog]:
    """Learn filters eagerly on a first job, then compress a second job with all of them."""
    compressor = Compressor(pack(), CompressorConfig(min_count=2))
    for _ in range(2):
        job = compressor.job()
        for start in range(0, len(lines), batch):
            job.feed(lines[start : start + batch])
        log = job.finish()
    return compressor, log


def _kept_numbers(log: JobLog) -> set[int]:
    return {k.line_no for k in log.kept}


@pytest.mark.parametrize("path", loghub_datasets(), ids=lambda p: p.parent.name)
def test_loghub_failure_lines_are_kept(path: Path) -> None:
    lines = read_lines(path)
    compressor, log = _compress_twice(lines)
    kept = _kept_numbers(log)
    missing = [
        (n, line) for n, line in enumerate(lines, 1) if ORACLE.search(line) and n not in kept
    ]
    assert missing == []
    guard = Guard(pack())
    flagged = guard.single(lines)
    assert {i + 1 for i in flagged} <= kept
    # Not vacuous: filters were learned and used on this dataset.
    assert compressor.filters.enabled
    assert log.lines_kept < len(lines)


def test_loghub_has_16_datasets() -> None:
    assert len(loghub_datasets()) == 16


def test_bgl_alert_lines_are_all_kept() -> None:
    path = next(p for p in loghub_datasets() if p.parent.name == "BGL")
    lines = read_lines(path)
    _, log = _compress_twice(lines)
    kept = _kept_numbers(log)
    alerts = [n for n, line in enumerate(lines, 1) if not line.startswith("- ")]
    assert len(alerts) > 100
    assert [n for n in alerts if n not in kept] == []


def _traceback_spans(lines: list[str]) -> list[list[int]]:
    """1-based line numbers from each `Traceback` header through its exception line."""
    spans: list[list[int]] = []
    i = 0
    while i < len(lines):
        if "Traceback (most recent call last)" not in lines[i]:
            i += 1
            continue
        span = [i + 1]
        j = i + 1
        while j < len(lines):
            body = strip_prefix(lines[j])
            if "Traceback (most recent call last)" in body:
                break
            span.append(j + 1)
            if body and not body[0].isspace() and re.match(r"[\w.]+(?::|$)", body):
                break
            j += 1
        spans.append(span)
        i = j
    return spans


FIXTURES = sorted(FIXTURES_DIR.glob("*.log"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_tracebacks_survive_whole(path: Path) -> None:
    lines = read_lines(path)
    compressor = Compressor(pack(), CompressorConfig(min_count=2))
    # A hostile filter on traceback frames, as a human might add it: it must lose.
    frames = Filter(
        id=99,
        template_id=-1,
        template="File <path>, line <int>, in <*>",
        pattern=r'^[ \t]*File[ \t]+"[^\n]*?",[ \t]+line[ \t]+[0-9]+,[ \t]+in[ \t]+[^ \t\n]+$',
        proposer=Proposer.HUMAN,
    )
    compressor.filters.filters.append(frames)
    log: JobLog | None = None
    for _ in range(2):
        job = compressor.job()
        for start in range(0, len(lines), 7):  # small batches: blocks span batch boundaries
            job.feed(lines[start : start + 7])
        log = job.finish()
    assert log is not None
    kept = _kept_numbers(log)
    for span in _traceback_spans(lines):
        assert [n for n in span if n not in kept] == [], span
    failure = [n for n, line in enumerate(lines, 1) if ORACLE.search(line)]
    assert [n for n in failure if n not in kept] == []
    spans = _traceback_spans(lines)
    if any('File "' in lines[n - 1] for span in spans for n in span):
        assert not frames.enabled
        assert any(d.filter_id == 99 for d in compressor.filters.disabled)


def test_a_filter_that_hits_a_failure_line_is_disabled_on_the_spot() -> None:
    compressor = Compressor(pack())
    bad = Filter(id=7, template_id=-1, template="worker <*> <*>", pattern=r"^worker [a-z]+ [a-z]+$")
    compressor.filters.filters.append(bad)
    job = compressor.job()
    kept = job.feed(["worker is idle", "worker was killed", "worker is idle", "worker is busy"])
    assert kept == [0, 1, 2, 3]  # the failure line and every line the broken filter matched
    assert not bad.enabled
    [event] = compressor.filters.disabled
    assert (event.filter_id, event.line_no, event.line) == (7, 2, "worker was killed")
    assert event.reason.startswith("matched a guarded line")  # a rule's pattern or a failure word
    assert job.feed(["worker is idle"]) == [0]


def test_traceback_continuation_spans_batches() -> None:
    guard = Guard(pack())
    state = GuardState()
    first = guard.scan(["step 1 ok", "Traceback (most recent call last):"], state)
    second = guard.scan(['  File "train.py", line 3, in <module>', "    main()"], state)
    third = guard.scan(["KeyError: 'LOCAL_RANK'", "step 2 ok"], state)
    assert first == {1: GuardReason.RULE}  # the rule pack's traceback trigger
    # Every frame is kept: as part of the open block, or because a rule flags a frame line itself.
    assert set(second) == {0, 1}
    assert second[1] is GuardReason.BLOCK
    assert set(third) == {0}
    assert state.open == {}


def test_failure_words_are_word_bounded() -> None:
    guard = Guard(pack())
    lines = [
        "Warning: NCCL_ASYNC_ERROR_HANDLING is deprecated",
        "loss=nan",
        "lm loss: 2.3 | grad norm: inf",
        "information about the run",
        "RuntimeError: boom",
        "cudaErrorLaunchFailure",
        "CUDA_ERROR_LAUNCH_FAILED",
        "E1201 10:00:00.123 rpc.cc:12] connection closed",
        "ncclSystemError: System call failed",
        "gpu-node-3:12:40 [3] NCCL WARN Call to connect returned Connection refused",
        "step 10 of 100",
        " iteration 10/100 | lm loss: 2.3E+00 | number of nan iterations:   0 |",
        " iteration 11/100 | lm loss: 2.3E+00 | number of nan iterations:   2 |",
        "tensor([nan, 1.0])",
        "NaN or Inf found in input tensor.",
    ]
    assert sorted(guard.single(lines)) == [1, 2, 4, 5, 6, 7, 8, 9, 12, 13, 14]


def test_hyperscan_and_regex_guards_agree_on_every_corpus() -> None:
    lines: list[str] = []
    for path in [*loghub_datasets(), *FIXTURES]:
        lines += read_lines(path)
    lines += ["ünïcode error", "ÉRROR", "K\u212aILLED", "x" * 70_000 + " fatal"]
    fast = Guard(pack(), engine="hyperscan")
    plain = Guard(pack("regex"), engine="regex")
    for start in range(0, len(lines), 4096):
        chunk = lines[start : start + 4096]
        assert fast.single(chunk) == plain.single(chunk)


def test_hyperscan_guard_finds_failure_lines_wherever_they_sit_in_the_chunk() -> None:
    """Hyperscan 0.9.1 misses some multi-line regex matches past a certain offset of a chunk
    (tests/templates/test_filters.py); the failure words must not: every example line of the
    pack, after a first line of 0 to 79 bytes (and a few longer), is guarded alike."""
    fast = Guard(pack(), engine="hyperscan")
    plain = Guard(pack("regex"), engine="regex")
    examples = [
        line
        for rule in pack().rules
        for example in rule.spec.examples.match
        for line in example.splitlines()
    ]
    # The `regex` guard reads line by line, so its answer does not depend on the offset: it is
    # computed once per example (a filler line of x's is never guarded), hyperscan's per offset.
    expected = [plain.single(["x", line]) for line in examples]
    for width in [*range(80), 200, 1000, 5000]:
        assert plain.single(["x" * width]) == fast.single(["x" * width]) == {}
        for line, wanted in zip(examples, expected, strict=True):
            assert fast.single(["x" * width, line]) == wanted, (width, line)


def test_the_rows_of_a_query_gpu_table_are_kept_with_their_header() -> None:
    """A row (`1, Reset`) says nothing alone; the guard keeps it because its header opened the
    block, whatever a filter learned about short comma-separated lines."""
    guard = Guard(pack())
    state = GuardState()
    kept = guard.scan(
        ["step 1 ok", "index, gpu_recovery_action", "0, None", "1, Reset", "step 2 ok"], state
    )
    assert {1, 2, 3} <= set(kept)
    assert kept[3] is GuardReason.BLOCK
    assert 4 not in kept
