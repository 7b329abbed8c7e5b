"""The compression stage in the ingest pipeline: families learned once, jobs bounded."""

from __future__ import annotations

from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.rules import RuleRegistry, make_batch
from diagnoser.templates.stage import CompressionStage
from tests.templates.corpus import RULES_DIR
from tests.templates.test_compressor import training_lines


def _feed(pipeline: Pipeline, job: str, lines: list[str], batch: int = 500) -> None:
    key = StreamKey(job_id=job, stream="stdout", node="node-1", rank=None)
    for start in range(0, len(lines), batch):
        pipeline.process(key, make_batch(lines[start : start + batch], first_line_no=start + 1))


def test_a_new_job_of_a_known_family_starts_compressed() -> None:
    stage = CompressionStage(RuleRegistry(RULES_DIR))
    pipeline = Pipeline([stage])
    _feed(pipeline, "gpt-7b-run1", training_lines(1, 500))
    _feed(pipeline, "gpt-7b-run2", training_lines(2, 500))
    first, second = stage.log("gpt-7b-run1"), stage.log("gpt-7b-run2")
    assert first is not None
    assert second is not None
    assert list(stage.families) == ["gpt-7b"]
    assert second.lines_kept * 3 <= first.lines_kept
    assert stage.lines_in == first.lines_in + second.lines_in
    assert stage.lines_kept == first.lines_kept + second.lines_kept


def test_family_from_job_metadata_and_a_bounded_log() -> None:
    stage = CompressionStage(RuleRegistry(RULES_DIR), max_entries=10)
    stage.set_family("job-a", "llama")
    stage.set_family("job-b", "bert")
    pipeline = Pipeline([stage])
    lines = [f"novel line number {i} about topic {'xyz'[i % 3] * (i % 7)}" for i in range(50)]
    _feed(pipeline, "job-a", ["RuntimeError: boom", *lines])
    _feed(pipeline, "job-b", training_lines(1, 50))
    assert set(stage.families) == {"llama", "bert"}
    log = stage.log("job-a")
    assert log is not None
    assert log.lines_in == 51
    assert len(log.kept) <= 10
    assert log.kept[0].text == "RuntimeError: boom"
    assert log.lines_kept > len(log.kept)


def test_a_job_evicted_before_its_flush_loses_nothing_it_kept() -> None:
    """Evicted from memory, then sent again before the database took its lines: both
    incarnations' lines and counts are handed to the next flush."""
    stage = CompressionStage(RuleRegistry(RULES_DIR), max_jobs=1)
    pipeline = Pipeline([stage])
    _feed(pipeline, "job-a", ["RuntimeError: boom", "worker 1 started"])
    _feed(pipeline, "job-b", ["worker 2 started"])
    _feed(pipeline, "job-a", ["worker 3 started"])
    flushes = {f.job_id: f for f in stage.drain()}
    a = flushes["job-a"]
    assert (a.lines_in, a.lines_kept) == (3, 3)
    assert [e.text for e in a.entries] == [
        "RuntimeError: boom",
        "worker 1 started",
        "worker 3 started",
    ]
    assert a.entries[0].kind == "guarded"
    assert flushes["job-b"].lines_in == 1
    assert stage.drain() == []


def test_a_stream_split_over_two_replicas_keeps_its_own_line_numbers() -> None:
    """Each replica numbered kept lines from its own start: the second upload's failure line,
    line 450 of the stream, was stored as line 150."""
    lines = training_lines(1, 600)[:600]
    lines[449] = "RuntimeError: CUDA error: an illegal memory access was encountered"
    key = StreamKey(job_id="gpt-7b-run1", stream="stdout", node="node-1", rank=None)
    first, second = (CompressionStage(RuleRegistry(RULES_DIR)) for _ in range(2))
    first.process(key, make_batch(lines[:300], first_line_no=1))
    second.process(key, make_batch(lines[300:], first_line_no=301))
    log = second.log("gpt-7b-run1")
    assert log is not None
    failure = [k.line_no for k in log.kept if k.guarded is not None]
    assert failure == [450]
    assert all(301 <= k.line_no <= 600 for k in log.kept)
    runs = [e for flush in second.drain() for e in flush.entries if e.kind == "run"]
    assert runs
    assert all(301 <= e.line_no <= 600 for e in runs)
