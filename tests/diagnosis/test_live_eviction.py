"""Which jobs a full live stage lets go: the ones whose state costs least to lose.

A flood of new jobs (one upload each, junk or not) must not push out a job with unsettled
events or an established running job whose progress hang detection needs. A failing job's
state is cheaper: its diagnosis is stored and the flow brings the evidence back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.ingest.framing import Framer
from diagnoser.pipeline import StreamKey
from diagnoser.rules import RuleRegistry

ROOT = Path(__file__).resolve().parents[2]
MAX_JOBS = 4
NOISE = "iteration 1200/50000 | loss 2.3140 | lr 3.0e-04\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB.\n"


@pytest.fixture
def stage() -> DiagnosisStage:
    return DiagnosisStage(RuleRegistry(ROOT / "rules"), max_jobs=MAX_JOBS)


def post(stage: DiagnosisStage, job: str, text: str, settle: bool = True) -> None:
    stage.process(StreamKey(job, "node-0/stdout", "node-0", None), Framer().feed(text.encode()))
    if settle:
        stage.changed_verdict(job)  # what the flow's settle does after each commit


def flood(stage: DiagnosisStage, text: str, jobs: int = 3 * MAX_JOBS) -> None:
    for n in range(jobs):
        post(stage, f"junk-{n}", text)


def test_a_flood_of_new_jobs_evicts_its_own_kind_first(stage: DiagnosisStage) -> None:
    post(stage, "running", NOISE)
    post(stage, "running", NOISE)  # established: sent more than once
    post(stage, "failed", OOM)
    flood(stage, NOISE)
    assert stage.tracks("running")
    assert stage.tracks("failed")
    assert len(stage.jobs) == MAX_JOBS


def test_unsettled_events_outlive_a_flood_of_failing_jobs(stage: DiagnosisStage) -> None:
    post(stage, "unsettled", OOM, settle=False)  # scanned, its commit not settled yet
    post(stage, "running", NOISE)
    post(stage, "running", NOISE)
    flood(stage, OOM)
    assert stage.tracks("unsettled")
    assert stage.unsettled("unsettled")
    assert stage.tracks("running")  # a stored failure is cheaper to lose than its progress
    assert len(stage.jobs) == MAX_JOBS


def test_when_every_job_has_pending_work_the_least_recent_goes(stage: DiagnosisStage) -> None:
    for n in range(MAX_JOBS + 2):
        post(stage, f"pending-{n}", OOM, settle=False)
    assert list(stage.jobs) == [f"pending-{n}" for n in range(2, MAX_JOBS + 2)]


def test_a_settled_job_becomes_evictable_again(stage: DiagnosisStage) -> None:
    post(stage, "pending", OOM, settle=False)
    flood(stage, OOM)
    assert stage.tracks("pending")
    stage.changed_verdict("pending")
    flood(stage, OOM, jobs=MAX_JOBS)
    assert not stage.tracks("pending")
