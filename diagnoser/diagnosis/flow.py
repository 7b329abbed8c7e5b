"""The diagnosis flow: the one place that knows the order rules -> [LLM] -> persist -> actions.

Ingest calls `settle(job_id)` after it commits lines. A verdict that changed becomes, in one
transaction, the job's open diagnosis (created, or updated as later evidence arrives: a hardware
error after the timeouts upgrades a restart to a cordon) plus its outbox action; watchers are
told after the commit.

The hang detector (`watch_stalls`) is the other producer: a job that stopped without a reason
gets its hang diagnosis through the same store-and-outbox step, and progress resuming later
resolves it.

The LLM stage plugs in where marked: an inconclusive verdict is stored at once with action
`escalate` and would be handed to a bounded queue for the LLM, never awaited here.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from diagnoser.diagnosis.correlate import Source, Status, Verdict
from diagnoser.diagnosis.hang import HANG_TYPES, LifecycleEvent
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.schemas import DiagnosisStatus, DiagnosisView
from diagnoser.rules import RuleEvent
from diagnoser.store.database import Sessions
from diagnoser.store.diagnoses import (
    active_for_job,
    lifecycle_events,
    queue_action,
    set_culprits,
    supersede_pending,
)
from diagnoser.store.models import DiagnosisRow, utcnow

logger = logging.getLogger(__name__)

MAX_EVIDENCE = 50
MAX_SETTLES_BEFORE_RESTART = 3
CONTEXT_LINES = 5


def evidence_record(event: RuleEvent) -> dict[str, Any]:
    return {
        "node": event.node,
        "rank": event.rank,
        "time": event.time,
        "offset": event.offset,
        "line_no": event.line_no,
        "rule_id": event.rule_id,
        "text": event.text,
        "context": list(event.evidence[-CONTEXT_LINES:]),
    }


def apply(row: DiagnosisRow, verdict: Verdict, digest: str) -> None:
    """Write the verdict into the row; a human's override of category and action stands."""
    row.evidence = [evidence_record(e) for e in verdict.evidence[:MAX_EVIDENCE]]
    row.rule_ids = list(verdict.rule_ids)
    row.affected_ranks = list(verdict.affected_ranks)
    row.ruleset_digest = digest
    row.updated_at = utcnow()
    if row.source == Source.HUMAN:
        return
    row.failure_type = verdict.failure_type
    row.category = verdict.category.value if verdict.category else None
    row.action = verdict.action.value
    row.culprit_nodes = list(verdict.culprit_nodes)
    row.confidence = verdict.confidence
    row.source = verdict.source.value
    row.summary = verdict.summary


class DiagnosisFlow:
    def __init__(
        self,
        sessions: Sessions,
        stage: DiagnosisStage,
        hub: DiagnosisHub,
    ) -> None:
        self.sessions = sessions
        self.stage = stage
        self.hub = hub
        self.changes_by_action: Counter[str] = Counter()
        """Diagnoses created or changed, by the action they then recommend."""
        self.hangs: Counter[str] = Counter()
        """Hangs `reported` by the detector and `resolved` by progress resuming."""
        self._locks: dict[str, anyio.Lock] = {}
        self._lock_users: Counter[str] = Counter()

    async def settle(self, job_id: str) -> list[str]:
        """Persist the job's verdict if it changed; return the ids of diagnoses it touched."""
        touched = []
        if self.stage.take_resumed(job_id):
            try:
                async with self._job_lock(job_id):
                    touched.extend(await self._resolve_hang(job_id))
            except Exception:
                self.stage.flag_resumed(job_id)
                raise
        changed = self.stage.changed_verdict(job_id)
        if changed is None:
            return touched
        verdict, ruleset = changed
        if verdict.status is Status.HEALTHY:
            return touched
        # LLM seam: Status.INCONCLUSIVE verdicts go to the LLM stage's queue here.
        async with self._job_lock(job_id):
            return [*touched, await self._store(job_id, verdict, ruleset.digest)]

    async def report_stalls(self, timeout_s: float) -> list[str]:
        """Store a hang diagnosis for every running job stalled past its window (diagnosis/hang.py).

        Each job is handled on its own: a failed store leaves that job to the next round.
        """
        stored = []
        for job_id, window_s in self.stage.stall_candidates(timeout_s):
            try:
                if self.stage.needs_lifecycle(job_id, window_s):
                    self.stage.load_lifecycle(job_id, await self._lifecycle(job_id))
                found = self.stage.hang(job_id, window_s)
                if found is None:
                    continue
                verdict, ruleset, since = found
                async with self._job_lock(job_id):
                    stored.append(await self._store(job_id, verdict, ruleset.digest, hang=True))
                    self.hangs["reported"] += 1
                    if self.stage.mark_hung(job_id, since, verdict) is False:
                        await self._resolve_hang(job_id)  # progress arrived during the store
            except Exception:
                logger.exception("hang check for job %s failed; the next round retries", job_id)
        return stored

    async def watch_stalls(self, timeout_s: float, interval_s: float) -> None:
        """The service's hang detector: look for stalled jobs every `interval_s`, forever."""
        while True:
            await anyio.sleep(interval_s)
            try:
                await self.report_stalls(timeout_s)
            except Exception:  # only per-job failures are expected; the detector must live on
                logger.exception("hang check round failed")

    async def lifecycle(self, job_id: str, event: LifecycleEvent) -> None:
        """A launcher's lifecycle event, told to the live stage.

        Called before the event is stored, so the database holds only earlier events. On a
        restart, the old attempt's open hang is resolved and what it found but had not
        stored yet is stored; only then does its live state start over. The last check and the
        reset run without an await between them, so no scanned line falls in between.
        """
        if self.stage.tracks(job_id) and self.stage.needs_lifecycle(job_id, float("inf")):
            # What this process has not seen (events before its own restart, or posted to
            # another replica) decides whether this event is a restart.
            with contextlib.suppress(Exception):
                self.stage.load_lifecycle(job_id, await self._lifecycle(job_id))
        if not self.stage.is_restart(job_id, event):
            self.stage.record_lifecycle(job_id, event)
            return
        try:
            async with self._job_lock(job_id):
                await self._resolve_hang(job_id, "the job was restarted")
            for _ in range(MAX_SETTLES_BEFORE_RESTART):
                await self.settle(job_id)
                if not self.stage.unsettled(job_id):
                    break
        except Exception:  # the restart must still begin: the next commit settles again
            logger.exception("settling job %s before its restart failed", job_id)
        self.stage.record_lifecycle(job_id, event)

    @asynccontextmanager
    async def _job_lock(self, job_id: str) -> AsyncIterator[None]:
        """One writer per job at a time: ingest's settle and the hang detector never race to
        create two open diagnoses, or resolve a hang before it is stored."""
        lock = self._locks.setdefault(job_id, anyio.Lock())
        self._lock_users[job_id] += 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[job_id] -= 1
            if not self._lock_users[job_id]:
                del self._lock_users[job_id], self._locks[job_id]

    async def _lifecycle(self, job_id: str) -> list[LifecycleEvent]:
        async with self.sessions.begin() as session:
            rows = await lifecycle_events(session, job_id)
        return [
            LifecycleEvent(
                row.type, row.node, row.received_at.timestamp(), row.exit_code, row.signal
            )
            for row in rows
        ]

    async def _store(self, job_id: str, verdict: Verdict, digest: str, hang: bool = False) -> str:
        async with self.sessions.begin() as session:
            row = await active_for_job(session, job_id)
            if hang and row is not None and row.failure_type not in HANG_TYPES:
                # Another incident is open (a restarted attempt's old failure, say): a hang is
                # a new one and must not overwrite it or cancel its pending action.
                row = None
            if row is None:
                row = DiagnosisRow(
                    id=str(uuid.uuid4()),
                    job_id=job_id,
                    status=DiagnosisStatus.OPEN.value,
                    created_at=utcnow(),
                )
                session.add(row)
            apply(row, verdict, digest)
            row.progress = self.stage.progress(job_id)
            await session.flush()
            await set_culprits(session, row.id, row.culprit_nodes)
            await queue_action(session, row)
        self.changes_by_action[row.action] += 1
        self.hub.publish(DiagnosisView.model_validate(row))
        return row.id

    async def _resolve_hang(self, job_id: str, why: str = "progress resumed") -> list[str]:
        """A job reported hung made progress again: its hang diagnosis is resolved, with why.

        A restart it recommended and the operator has not claimed yet is superseded: the job
        runs again without it."""
        async with self.sessions.begin() as session:
            row = await active_for_job(session, job_id)
            if row is None or row.failure_type not in HANG_TYPES or row.source == Source.HUMAN:
                return []
            await supersede_pending(session, row.id)
            row.status = DiagnosisStatus.RESOLVED.value
            row.progress = self.stage.progress(job_id)
            step = (row.progress or {}).get("last_step")
            row.summary += f" Resolved: {why}{f' (step {step})' if step else ''}."
            row.updated_at = utcnow()
            await session.flush()
        self.hangs["resolved"] += 1
        self.hub.publish(DiagnosisView.model_validate(row))
        return [row.id]
