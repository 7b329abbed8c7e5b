"""The diagnosis flow keeps stored evidence when the live state is gone, on both databases.

The service's composition (writer -> live stage -> flow -> store), in process, with a live
stage that holds only a few jobs, so that a flood of other jobs evicts the one under test
between its timeouts and its Xid. The restart case runs over HTTP in tests/api/test_diagnoses.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from diagnoser.config import IngestSettings
from diagnoser.diagnosis.flow import DiagnosisFlow, apply, evidence_record, stored_event
from diagnoser.diagnosis.hang import LifecycleEvent
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.schemas import DiagnosisView
from diagnoser.ingest.framing import Framer
from diagnoser.ingest.writer import StreamLocks, StreamWriter
from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.rules import RuleRegistry
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.diagnoses import active_for_job
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import DiagnosisRow, JobEventRow

ROOT = Path(__file__).resolve().parents[2]
MAX_JOBS = 4
WINDOW = 1800.0
TIMEOUT = (
    "[rank{rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, "
    "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n"
)
TIMEOUTS = "".join(TIMEOUT.format(rank=r) for r in range(8, 12))
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
NOISE = "iteration 1200/50000 | loss 2.3140 | lr 3.0e-04\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB.\n"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class Service:
    sessions: Sessions
    stage: DiagnosisStage
    flow: DiagnosisFlow
    writer: StreamWriter
    clock: Clock

    async def post(self, job: str, node: str, text: str) -> None:
        async def body() -> AsyncIterator[bytes]:
            yield text.encode()

        key = StreamKey(job, f"{node}/stdout", node, None)
        await self.writer.write(key, body(), offset=None, job_metadata={})

    async def diagnosis(self, job: str) -> dict[str, Any]:
        async with self.sessions.begin() as session:
            row = await active_for_job(session, job)
            assert row is not None, f"no open diagnosis for {job}"
            return DiagnosisView.model_validate(row).model_dump(mode="json")


@pytest.fixture
async def service(database_url: str) -> AsyncIterator[Service]:
    db = parse_database_url(database_url)
    upgrade(db)
    sessions = Sessions(create_service_engine(db), db)
    clock = Clock()
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"), clock=clock, max_jobs=MAX_JOBS)
    flow = DiagnosisFlow(sessions, stage, DiagnosisHub())

    async def settle(key: StreamKey) -> list[str]:
        return await flow.settle(key.job_id)

    writer = StreamWriter(
        sessions, Pipeline([stage]), IngestSettings(), StreamLocks(), after_commit=settle
    )
    try:
        yield Service(sessions, stage, flow, writer, clock)
    finally:
        await sessions.close()


def incident(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """What the on-call engineer reads, without ids and times."""
    fields = ("failure_type", "category", "action", "summary", "culprit_nodes", "rule_ids")
    evidence = diagnosis["evidence"]
    return {
        **{key: diagnosis[key] for key in (*fields, "affected_ranks", "confidence", "source")},
        "evidence": [(e["node"], e["rank"], e["rule_id"], e["text"]) for e in evidence],
    }


async def the_same_incident_with_a_flood_between(service: Service, junk: str) -> None:
    await service.post("steady", "gpu-017", NOISE + TIMEOUTS)
    await service.post("steady", "gpu-3", XID79)
    steady = await service.diagnosis("steady")
    await service.post("flooded", "gpu-017", NOISE + TIMEOUTS)
    before = await service.diagnosis("flooded")
    for n in range(3 * MAX_JOBS):
        await service.post(f"junk-{n}", "node-0", junk)
    await service.post("flooded", "gpu-3", XID79)
    after = await service.diagnosis("flooded")
    assert after["id"] == before["id"]
    assert (after["action"], after["culprit_nodes"]) == ("cordon_node_and_restart", ["gpu-3"])
    assert set(after["rule_ids"]) == {"xid_fallen_off_bus", "nccl_watchdog_timeout"}
    assert after["affected_ranks"] == [8, 9, 10, 11]
    assert after["evidence"][0]["text"] == XID79.strip()
    assert {e["text"] for e in before["evidence"]} <= {e["text"] for e in after["evidence"]}
    assert incident(after) == incident(steady)


async def test_a_flood_of_quiet_jobs_evicts_them_before_a_job_with_an_incident(
    service: Service,
) -> None:
    await the_same_incident_with_a_flood_between(service, NOISE)
    assert service.stage.tracks("flooded")
    assert len(service.stage.jobs) <= MAX_JOBS


async def test_a_flood_of_failing_jobs_evicts_the_incident_and_its_evidence_comes_back(
    service: Service,
) -> None:
    await the_same_incident_with_a_flood_between(service, OOM)
    assert len(service.stage.jobs) <= MAX_JOBS


async def test_a_job_restart_keeps_the_earlier_attempts_evidence_without_correlating_it(
    service: Service,
) -> None:
    """After a launcher restart the new attempt's failure is what the diagnosis says; the old
    attempt's evidence stays in it, but does not outrank the new failure."""
    flow = service.flow
    await flow.lifecycle("attempts", LifecycleEvent("started", None, 1.0))
    await service.post("attempts", "gpu-3", XID79)
    await flow.lifecycle("attempts", LifecycleEvent("exited", None, 2.0, 1))
    await flow.lifecycle("attempts", LifecycleEvent("started", None, 3.0))
    await service.post("attempts", "gpu-5", OOM)
    after = await service.diagnosis("attempts")
    assert (after["failure_type"], after["action"]) == ("cuda_oom", "notify_user")
    assert after["evidence"][0]["text"] == OOM.strip()
    assert XID79.strip() in [e["text"] for e in after["evidence"]]
    assert set(after["rule_ids"]) >= {"xid_fallen_off_bus"}


async def test_a_failed_job_whose_live_state_was_evicted_is_not_reported_hung(
    service: Service,
) -> None:
    """The surviving ranks print a little and stop: the stored failure explains it."""
    await service.post("stopped", "gpu-017", NOISE)
    async with service.sessions.begin() as session:
        at = datetime.fromtimestamp(service.clock.now, UTC)
        session.add(JobEventRow(job_id="stopped", type="started", ts=at, received_at=at))
    await service.post("stopped", "gpu-017", NOISE + TIMEOUTS)
    failure = await service.diagnosis("stopped")
    for n in range(3 * MAX_JOBS):
        await service.post(f"junk-{n}", "node-0", OOM)
    assert not service.stage.tracks("stopped")
    await service.post("stopped", "gpu-017", NOISE)
    service.clock.now += WINDOW + 1
    assert await service.flow.report_stalls(WINDOW) == []
    assert (await service.diagnosis("stopped"))["id"] == failure["id"]
    async with service.sessions.begin() as session:
        rows = await session.scalars(select(DiagnosisRow).where(DiagnosisRow.job_id == "stopped"))
        assert [row.failure_type for row in rows] == ["nccl_timeout"]


def test_records_stored_before_rule_fields_were_kept_are_correlated_with_the_rule_pack() -> None:
    registry = RuleRegistry(ROOT / "rules")
    ruleset = registry.active
    stage = DiagnosisStage(registry)
    stage.process(StreamKey("j", "gpu-3/stdout", "gpu-3", None), Framer().feed(XID79.encode()))
    changed = stage.changed_verdict("j")
    assert changed is not None
    [event] = changed[0].evidence
    record = evidence_record(event)
    legacy = {k: record[k] for k in ("node", "rank", "time", "offset", "line_no", "rule_id")}
    legacy |= {"text": record["text"], "context": record["context"]}
    again = stored_event(legacy, ruleset)
    assert again is not None
    assert (again.failure_type, again.category, again.action) == (
        event.failure_type,
        event.category,
        event.action,
    )
    assert stored_event({**legacy, "rule_id": "no_such_rule"}, ruleset) is None


def test_an_update_never_drops_stored_evidence_rule_ids_or_ranks() -> None:
    registry = RuleRegistry(ROOT / "rules")
    stage = DiagnosisStage(registry)
    stage.process(StreamKey("j", "gpu-3/stdout", "gpu-3", None), Framer().feed(XID79.encode()))
    changed = stage.changed_verdict("j")
    assert changed is not None
    kept = {"node": "gpu-9", "rank": 70, "time": 0.0, "offset": 0, "line_no": 1,
            "rule_id": "no_progress", "text": "the hang's last line", "context": []}  # fmt: skip
    row = DiagnosisRow(evidence=[kept], rule_ids=["old_rule"], affected_ranks=[70])
    apply(row, changed[0], "digest")
    assert [e["text"] for e in row.evidence] == [XID79.strip(), "the hang's last line"]
    assert row.rule_ids == ["xid_fallen_off_bus", "old_rule"]
    assert row.affected_ranks == [70]


def replica(sessions: Sessions) -> Service:
    """One replica's stage, flow and writer on a shared database."""
    clock = Clock()
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"), clock=clock)
    flow = DiagnosisFlow(sessions, stage, DiagnosisHub())
    writer = StreamWriter(sessions, Pipeline([stage]), IngestSettings(), StreamLocks())
    return Service(sessions, stage, flow, writer, clock)


async def test_two_replicas_settling_one_job_at_once_store_one_diagnosis(postgres_url: str) -> None:
    """Replica A holds node 1's timeouts, B node 3's Xid; both settle at the same moment: the
    per-job lock makes the second read and extend the first's diagnosis, not add another."""
    db = parse_database_url(postgres_url)
    upgrade(db)
    a, b = (replica(Sessions(create_service_engine(db), db)) for _ in range(2))
    try:
        for round_ in range(5):
            job = f"split-{round_}"
            await a.post(job, "node-1", TIMEOUTS)
            await b.post(job, "node-3", XID79)
            await asyncio.gather(a.flow.settle(job), b.flow.settle(job))
            async with a.sessions() as session:
                rows = list(
                    await session.scalars(select(DiagnosisRow).where(DiagnosisRow.job_id == job))
                )
            assert [(r.action, r.culprit_nodes) for r in rows] == [
                ("cordon_node_and_restart", ["node-3"])
            ]
    finally:
        await a.sessions.close()
        await b.sessions.close()
