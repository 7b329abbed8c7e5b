"""The live stage's hang bookkeeping, on a fake clock, with the real rule pack.

These are the states the service passes through between two checks: not known to be running,
running and stalled, a store that failed, progress that arrived while the hang was being stored,
a restart from checkpoint. The service-level behaviour is tested over HTTP in
tests/api/test_hangs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.hang import LifecycleEvent
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.ingest.framing import Framer
from diagnoser.pipeline import StreamKey
from diagnoser.rules import RuleRegistry

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 1800.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def stage(clock: Clock) -> DiagnosisStage:
    return DiagnosisStage(RuleRegistry(ROOT / "rules"), clock=clock)


def send(stage: DiagnosisStage, text: str, node: str = "node-0", job: str = "job") -> None:
    framer = Framer()
    batch = framer.feed(text.encode())
    stage.process(StreamKey(job, f"{node}/stdout", node, None), batch)
    stage.changed_verdict(job)  # what the flow's settle does after each commit


def steps(first: int, last: int) -> str:
    return "".join(f"iteration {i}/50000 | lm loss: 2.41E+00\n" for i in range(first, last + 1))


def started(stage: DiagnosisStage, clock: Clock, node: str | None = None, job: str = "job") -> None:
    stage.record_lifecycle(job, LifecycleEvent("started", node, clock.now))
    if job in stage.jobs:
        stage.load_lifecycle(job, [])  # nothing more in the database


def candidates(stage: DiagnosisStage) -> list[str]:
    return [job for job, _ in stage.stall_candidates(WINDOW)]


def test_a_stall_is_a_hang_only_for_a_job_known_to_be_running(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 5), job="no-events")
    send(stage, steps(1, 5), job="running")
    started(stage, clock, job="running")
    clock.now += WINDOW - 1
    assert candidates(stage) == []
    clock.now += 1
    assert sorted(candidates(stage)) == ["no-events", "running"]
    assert stage.hang("no-events", WINDOW) is None
    found = stage.hang("running", WINDOW)
    assert found is not None
    assert found[0].failure_type == "hang"
    assert candidates(stage) == ["running"]  # the finished-looking job is not asked again


def test_an_unstored_hang_is_found_again_next_round(stage: DiagnosisStage, clock: Clock) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)
    clock.now += WINDOW
    assert stage.hang("job", WINDOW) is not None  # ... and then the database write failed
    clock.now += 30
    assert candidates(stage) == ["job"]


def test_progress_during_the_store_means_resolve_at_once(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)
    clock.now += WINDOW
    found = stage.hang("job", WINDOW)
    assert found is not None
    verdict, _, since = found
    send(stage, steps(6, 6))  # arrives while the hang is being written
    assert stage.mark_hung("job", since, verdict) is False


def test_a_stored_hang_is_reported_once_then_resolved_by_progress(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)
    clock.now += WINDOW
    verdict, _, since = stage.hang("job", WINDOW) or pytest.fail("no hang")
    assert stage.mark_hung("job", since, verdict)
    clock.now += WINDOW
    assert candidates(stage) == []
    send(stage, "GET /metrics 200 OK\n")  # a heartbeat line is not progress
    assert stage.take_resumed("job") is False
    send(stage, steps(6, 6))
    assert stage.take_resumed("job") is True
    assert stage.take_resumed("job") is False


def test_the_hang_itself_does_not_stretch_the_next_window(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 1))
    started(stage, clock)
    for step in range(1, 6):
        send(stage, steps(step, step))
        clock.now += 60
    clock.now += WINDOW
    verdict, _, since = stage.hang("job", WINDOW) or pytest.fail("no hang")
    stage.mark_hung("job", since, verdict)
    send(stage, steps(6, 6))
    stage.take_resumed("job")
    clock.now += WINDOW
    assert candidates(stage) == ["job"]


def test_slow_steps_widen_the_window(stage: DiagnosisStage, clock: Clock) -> None:
    send(stage, steps(1, 1))
    started(stage, clock)
    for step in range(1, 4):
        send(stage, steps(step, step))
        clock.now += 2400
    clock.now += 2 * 2400 - 1  # 1 s short of 3 x 2400 s since the last step
    assert candidates(stage) == []
    clock.now += 1
    assert candidates(stage) == ["job"]


def test_a_failure_blocks_hangs_until_a_restart_starts_a_new_attempt(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 100) + "torch.OutOfMemoryError: CUDA out of memory.\n")
    started(stage, clock)
    clock.now += WINDOW
    assert candidates(stage) == []
    started(stage, clock)  # the operator restarted it from the step-50 checkpoint
    send(stage, steps(51, 60))
    clock.now += WINDOW
    assert candidates(stage) == ["job"]
    send(stage, steps(61, 61))
    assert candidates(stage) == []  # step 61 < 100 still counts as progress in this attempt


def test_exits_heartbeats_and_failed_nodes(stage: DiagnosisStage, clock: Clock) -> None:
    for node in ("node-0", "node-1", "node-2"):
        send(stage, steps(1, 5), node=node)
        stage.record_lifecycle("job", LifecycleEvent("heartbeat", node, clock.now))
    stage.record_lifecycle(
        "job", LifecycleEvent("exited", "node-2", clock.now, exit_code=-9, signal="SIGKILL")
    )
    clock.now += WINDOW - 60
    for node in ("node-0", "node-1"):
        stage.record_lifecycle("job", LifecycleEvent("heartbeat", node, clock.now))
    clock.now += 60
    verdict, _, _ = stage.hang("job", WINDOW) or pytest.fail("no hang")
    assert verdict.culprit_nodes == ("node-2",)
    assert "node-2 reported a failed exit" in verdict.summary
    clock.now += WINDOW  # the heartbeats stopped too: the launchers may be gone with the nodes
    assert stage.hang("job", WINDOW) is None


def test_an_exit_of_the_whole_job_ends_it(stage: DiagnosisStage, clock: Clock) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)
    stage.record_lifecycle("job", LifecycleEvent("exited", None, clock.now, exit_code=0))
    clock.now += WINDOW
    assert stage.hang("job", WINDOW) is None


def test_lifecycle_read_from_the_database_counts_and_is_refreshed(
    stage: DiagnosisStage, clock: Clock
) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)  # seen here; another replica may still have seen more
    clock.now += WINDOW
    assert stage.needs_lifecycle("job", WINDOW)
    stage.load_lifecycle("job", [LifecycleEvent("started", None, clock.now - WINDOW)])
    assert not stage.needs_lifecycle("job", WINDOW)
    assert stage.hang("job", WINDOW) is not None
    clock.now += WINDOW
    assert stage.needs_lifecycle("job", WINDOW)
    stage.load_lifecycle("job", [LifecycleEvent("exited", None, clock.now - 5, exit_code=0)])
    assert stage.hang("job", WINDOW) is None  # the exit went to another replica


def test_every_node_exiting_ends_the_job(stage: DiagnosisStage, clock: Clock) -> None:
    for node in ("node-0", "node-1"):
        send(stage, steps(1, 5), node=node)
    started(stage, clock)
    for node in ("node-0", "node-1"):
        stage.record_lifecycle("job", LifecycleEvent("started", node, clock.now))
    clock.now += 10
    for node in ("node-0", "node-1"):
        stage.record_lifecycle("job", LifecycleEvent("exited", node, clock.now, exit_code=0))
    clock.now += WINDOW
    stage.load_lifecycle("job", [])
    assert stage.hang("job", WINDOW) is None


def test_a_late_first_started_is_not_a_restart(stage: DiagnosisStage, clock: Clock) -> None:
    send(stage, steps(1, 5))
    started(stage, clock)  # the launcher's first word arrives after the shipper's lines
    assert stage.jobs["job"].progress.last_step == 5


def test_progress_on_another_replica_moves_the_stall_and_resumes_a_hang(
    stage: DiagnosisStage, clock: Clock
) -> None:
    """This replica holds a quiet share of the job's streams; the others' steps (merged from
    the database) keep it from being a hang, and resume it once it is one."""
    started(stage, clock)
    send(stage, steps(1, 5))
    assert stage.take_activity() == {"job": (clock.now, clock.now)}
    assert stage.take_activity() == {}  # told once until it changes
    clock.now += WINDOW + 1
    assert candidates(stage) == ["job"]
    stage.merge_remote("job", clock.now - 10, clock.now - 10)  # another replica stepped
    assert stage.hang("job", WINDOW) is None
    assert candidates(stage) == []

    clock.now += WINDOW
    found = stage.hang("job", WINDOW)
    assert found is not None
    verdict, _, since = found
    assert stage.mark_hung("job", since, verdict) is True
    assert stage.hung_jobs() == ["job"]
    stage.merge_remote("job", clock.now, None)  # lines, no step: still hung
    assert not stage.take_resumed("job")
    stage.merge_remote("job", clock.now, clock.now)
    assert stage.take_resumed("job")
    assert stage.hung_jobs() == []
