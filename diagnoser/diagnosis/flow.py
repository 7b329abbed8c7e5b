"""The diagnosis flow: the one place that knows the order rules -> [LLM] -> persist -> actions.

Ingest calls `settle(job_id)` after it commits lines. A verdict that changed becomes, in one
transaction, the job's open diagnosis (created, or updated as later evidence arrives: a hardware
error after the timeouts upgrades a restart to a cordon) plus its outbox action; watchers are
told after the commit.

An update never drops what the diagnosis already holds. Live state is memory: after a service
restart or an LRU eviction it knows only the lines posted since, so the stored evidence is made
into rule events again and correlated with the new ones (the verdict is the one a process that
had seen every line would reach), and the row keeps its earlier evidence, rule ids and ranks.
Evidence from before a job restart (`EARLIER_ATTEMPT`) is kept but not correlated again.

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
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.actions.policy import PolicyConfig
from diagnoser.diagnosis.correlate import Source, Status, Verdict
from diagnoser.diagnosis.escalation import Escalator
from diagnoser.diagnosis.hang import HANG_TYPES, Lifecycle, LifecycleEvent
from diagnoser.diagnosis.hang import RULE_ID as HANG_RULE_ID
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.ownership import JobOwnership
from diagnoser.diagnosis.schemas import DiagnosisStatus, DiagnosisView
from diagnoser.rules import Action, Category, RuleEvent, RuleSet, Scope, Severity
from diagnoser.store import locks
from diagnoser.store.database import Sessions
from diagnoser.store.diagnoses import (
    ACTIVE,
    EARLIER_ATTEMPT,
    active_for_job,
    end_attempt,
    job_nodes,
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
RULE_FIELDS = ("failure_type", "category", "action", "severity", "scope")
"""What the rule said about a line, stored with its evidence (records from before: the rule's)."""


def evidence_record(event: RuleEvent) -> dict[str, Any]:
    """The stored form of a piece of evidence: what the API shows, and what the rule said
    (type, class, action, captures), so that the event can be correlated again later."""
    return {
        "node": event.node,
        "rank": event.rank,
        "time": event.time,
        "offset": event.offset,
        "line_no": event.line_no,
        "rule_id": event.rule_id,
        "text": event.text,
        "context": list(event.evidence[-CONTEXT_LINES:]),
        "failure_type": event.failure_type,
        "category": event.category.value,
        "action": event.action.value,
        "severity": event.severity.value,
        "scope": event.scope.value,
        "entities": dict(event.entities),
    }


def record_key(record: Mapping[str, Any]) -> tuple[object, object, object]:
    return (record.get("rule_id"), record.get("node"), record.get("rank"))


def stored_event(record: Mapping[str, Any], ruleset: RuleSet) -> RuleEvent | None:
    """The rule event a stored record was made from; None when it cannot take part in
    correlation again (a hang's tail line, an earlier attempt, a rule no longer known).

    Records stored before the rule's own fields were kept take them from the job's rule set.
    """
    if record.get(EARLIER_ATTEMPT) or record.get("rule_id") == HANG_RULE_ID:
        return None
    said = dict(record)
    rule = ruleset.by_id.get(str(record.get("rule_id")))
    if rule is not None and not said.keys() >= set(RULE_FIELDS):
        spec = rule.spec
        fields = (spec.failure_type, spec.category, spec.action, spec.severity, spec.scope)
        said = dict(zip(RULE_FIELDS, fields, strict=True)) | said
    try:
        rank = record.get("rank")
        return RuleEvent(
            rule_id=str(record["rule_id"]),
            failure_type=str(said["failure_type"]),
            category=Category(said["category"]),
            action=Action(said["action"]),
            severity=Severity(said["severity"]),
            scope=Scope(said["scope"]),
            entities={str(k): str(v) for k, v in dict(record.get("entities") or {}).items()},
            text=str(record["text"]),
            offset=int(record["offset"]),
            line_no=int(record["line_no"]),
            node=str(record["node"]),
            rank=None if rank is None else int(rank),
            time=float(record["time"]),
            evidence=tuple(str(line) for line in record.get("context") or ()),
        )
    except (KeyError, TypeError, ValueError):
        return None


def merged_evidence(
    stored: list[dict[str, Any]], events: Iterable[RuleEvent]
) -> list[dict[str, Any]]:
    """The verdict's evidence in its order (root first), with every stored record kept.

    A stored record stands for its (rule, node, rank) as it was first stored. New records fill
    the room left under MAX_EVIDENCE; a new root is always added. What the verdict no longer
    carries (an earlier attempt's, a hang's tail lines) follows at the end.
    """
    current = {record_key(r): r for r in stored if not r.get(EARLIER_ATTEMPT)}
    room = MAX_EVIDENCE - len(stored)
    merged = []
    for i, event in enumerate(events):
        record = current.pop((event.rule_id, event.node, event.rank), None)
        if record is None and (room > 0 or i == 0):
            record = evidence_record(event)
            room -= 1
        if record is not None:
            merged.append(record)
    kept = {id(r) for r in merged}
    merged.extend(r for r in stored if id(r) not in kept)
    return merged


def merged_progress(
    stored: dict[str, Any] | None, live: dict[str, int] | None
) -> dict[str, Any] | None:
    """Live progress over the stored one: a fresh live state may not have seen the checkpoint."""
    if stored is None or live is None:
        return live if live is not None else stored
    merged = {**stored, **live}
    step, checkpoint = merged.get("last_step"), merged.get("last_checkpoint_step")
    if isinstance(step, int) and isinstance(checkpoint, int):
        merged["steps_lost"] = max(0, step - checkpoint)
    return merged


def apply(row: DiagnosisRow, verdict: Verdict, digest: str) -> None:
    """Write the verdict into the row; a human's override of category and action stands, and
    so does an LLM decision until a rule explains the failure.

    Evidence, rule ids and affected ranks only grow: what the row held is kept."""
    row.evidence = merged_evidence(list(row.evidence or []), verdict.evidence)
    row.rule_ids = list(dict.fromkeys([*verdict.rule_ids, *(row.rule_ids or [])]))
    row.affected_ranks = sorted({*verdict.affected_ranks, *(row.affected_ranks or [])})
    row.ruleset_digest = digest
    row.updated_at = utcnow()
    if row.source == Source.HUMAN:
        return
    if row.source == Source.LLM and verdict.status is Status.INCONCLUSIVE:
        return  # the vote decided what the rules could not; more unexplained lines change nothing
    row.failure_type = verdict.failure_type
    row.category = verdict.category.value if verdict.category else None
    row.action = verdict.action.value
    row.culprit_nodes = list(verdict.culprit_nodes)
    row.confidence = verdict.confidence
    row.source = verdict.source.value
    row.summary = verdict.summary


BENIGN_EXIT_SIGNALS = frozenset({"SIGTERM", "SIGINT"})
"""A scheduler's cancel or preemption, or a person's Ctrl-C: an ending, not a failure."""


def _abnormal(event: LifecycleEvent) -> bool:
    if event.kind != "exited":
        return False
    if event.signal is not None:
        return event.signal not in BENIGN_EXIT_SIGNALS
    return event.exit_code not in (None, 0)


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
        self.action_policy = PolicyConfig()
        """The recovery-action policy its plans are judged by (the app sets the configured one)."""
        self.actions_changed: Callable[[], None] = lambda: None
        """Called after a commit that may have written actions: wakes claim long polls."""
        self.hangs: Counter[str] = Counter()
        """Hangs `reported` by the detector and `resolved` by progress resuming."""
        self._locks: dict[str, anyio.Lock] = {}
        self._lock_users: Counter[str] = Counter()
        self.escalator: Escalator | None = None
        """The LLM stage, when one is configured: inconclusive diagnoses are handed to it."""
        self.ownership: JobOwnership | None = None
        """Which jobs' stalls this replica judges (None: every job it sees, one process)."""

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
        async with self._job_lock(job_id):
            return [*touched, await self._store(job_id, verdict, ruleset.digest)]

    async def report_stalls(self, timeout_s: float) -> list[str]:
        """Store a hang diagnosis for every running job stalled past its window (diagnosis/hang.py).

        With several replicas (`ownership`), only the job's owner judges its stall, after it
        has merged what the others saw of the job; a hang another replica stored is adopted,
        not reported again, and progress anywhere resolves it. Each job is handled on its
        own: a failed store leaves that job to the next round.
        """
        stored = []
        if self.ownership is not None:
            await self._resume_elsewhere(self.ownership)
        for job_id, window_s in self.stage.stall_candidates(timeout_s):
            try:
                if self.ownership is not None:
                    if not self.ownership.owns(job_id):
                        continue  # another replica watches this job's stalls
                    await self.ownership.remote(job_id)
                if self.stage.needs_lifecycle(job_id, window_s):
                    self.stage.load_lifecycle(job_id, await self._lifecycle(job_id))
                found = self.stage.hang(job_id, window_s)
                if found is None:
                    continue
                verdict, ruleset, since = found
                async with self._job_lock(job_id):
                    if await self._hang_stored(job_id):
                        self.stage.adopt_hang(job_id)
                        continue
                    if await self._failure_stored(job_id):
                        continue  # the live state had lost it: a failure, not a hang, stopped it
                    stored.append(await self._store(job_id, verdict, ruleset.digest, hang=True))
                    self.hangs["reported"] += 1
                    if self.stage.mark_hung(job_id, since, verdict) is False:
                        await self._resolve_hang(job_id)  # progress arrived during the store
            except Exception:
                logger.exception("hang check for job %s failed; the next round retries", job_id)
        return stored

    async def _resume_elsewhere(self, ownership: JobOwnership) -> None:
        """Hung jobs whose progress came back on another replica are resolved here."""
        for job_id in self.stage.hung_jobs():
            try:
                await ownership.remote(job_id)
                if self.stage.take_resumed(job_id):
                    try:
                        async with self._job_lock(job_id):
                            await self._resolve_hang(job_id)
                    except Exception:
                        self.stage.flag_resumed(job_id)
                        raise
            except Exception:
                logger.exception("resume check for job %s failed; the next round retries", job_id)

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
        reset run without an await between them, so no scanned line falls in between. The open
        diagnosis's evidence is then the earlier attempt's: kept, but not correlated again.
        """
        if self.stage.tracks(job_id) and self.stage.needs_lifecycle(job_id, float("inf")):
            # What this process has not seen (events before its own restart, or posted to
            # another replica) decides whether this event is a restart.
            with contextlib.suppress(Exception):
                self.stage.load_lifecycle(job_id, await self._lifecycle(job_id))
        if not self.stage.is_restart(job_id, event):
            if event.kind == "started":
                # No attempt here to settle (none seen since this process started, say), but
                # the database may know that this starts a new one.
                try:
                    if await self._is_restart(job_id, event):
                        async with self._job_lock(job_id):
                            await self._end_attempt(job_id)
                except Exception:
                    logger.exception("ending job %s's earlier attempt failed", job_id)
            self.stage.record_lifecycle(job_id, event)
            if _abnormal(event) and self.stage.ended(job_id):
                await self._abnormal_exit(job_id, event)
            return
        try:
            async with self._job_lock(job_id):
                await self._resolve_hang(job_id, "the job was restarted")
            for _ in range(MAX_SETTLES_BEFORE_RESTART):
                await self.settle(job_id)
                async with self._job_lock(job_id):
                    await self._end_attempt(job_id)
                if not self.stage.unsettled(job_id):
                    break
        except Exception:  # the restart must still begin: the next commit settles again
            logger.exception("settling job %s before its restart failed", job_id)
        self.stage.record_lifecycle(job_id, event)

    async def _abnormal_exit(self, job_id: str, event: LifecycleEvent) -> None:
        """The job ended with an abnormal exit and nothing explains it yet: never silent.

        Only once every process has exited: while others still run, the hang detector watches
        them and names a node whose launcher failed as the suspect.

        The job gets an `inconclusive` / `escalate` diagnosis naming the exit, which the LLM
        stage (when configured) looks at with the job's trace. When the job already has an open
        incident, or a rule explains the exit once the last lines arrive, that one stands: the
        exit is only a symptom of it.
        """
        ruleset = self.stage.ruleset(job_id)
        digest = ruleset.digest if ruleset is not None else ""
        how = f"signal {event.signal}" if event.signal else f"exit code {event.exit_code}"
        where = f"on {event.node}" if event.node else "(job launcher)"
        verdict = Verdict(
            Status.INCONCLUSIVE,
            Action.ESCALATE,
            failure_type="abnormal_exit",
            category=Category.FRAMEWORK,
            confidence=0.3,
            summary=f"A process {where} exited with {how} and no rule explains why: escalate.",
        )
        try:
            async with self._job_lock(job_id):
                async with self.sessions.begin() as session:
                    if await active_for_job(session, job_id) is not None:
                        return
                await self._store(job_id, verdict, digest)
        except Exception:
            logger.exception("could not record job %s's abnormal exit", job_id)

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

    async def _is_restart(self, job_id: str, event: LifecycleEvent) -> bool:
        lifecycle = Lifecycle()
        for earlier in await self._lifecycle(job_id):
            lifecycle.record(earlier)
        return lifecycle.is_restart(event)

    async def _end_attempt(self, job_id: str) -> None:
        async with self.sessions.begin() as session:
            await locks.hold(session, locks.job(job_id))
            await end_attempt(session, job_id)

    async def _absorb_stored(
        self, session: AsyncSession, job_id: str, row: DiagnosisRow
    ) -> Verdict | None:
        """The verdict over the row's stored evidence and the live state's together; None when
        the live state knew all of it already (or is gone).

        Live state that began after the evidence was stored (a service restart, an eviction,
        another replica) does not know it; without this an Xid after a restart would replace
        the timeouts before it instead of outranking them."""
        ruleset = self.stage.ruleset(job_id)
        if ruleset is None:
            return None
        known = self.stage.event_keys(job_id)
        unseen = (r for r in row.evidence or [] if record_key(r) not in known)
        events = [e for r in unseen if (e := stored_event(r, ruleset)) is not None]
        if not events:
            return None
        return self.stage.absorb(job_id, events, await job_nodes(session, job_id))

    async def _hang_stored(self, job_id: str) -> bool:
        """The job's open diagnosis is a hang already (another replica, or this one before a
        restart, reported the stall)."""
        async with self.sessions.begin() as session:
            row = await active_for_job(session, job_id)
            return row is not None and row.failure_type in HANG_TYPES

    async def _failure_stored(self, job_id: str) -> bool:
        """The job's open diagnosis is a failure of this attempt that its live state does not
        know (restart, eviction): that failure explains the stall. The live state takes its
        evidence back and stops counting the job as a hang candidate."""
        async with self.sessions.begin() as session:
            row = await active_for_job(session, job_id)
            if row is None or row.failure_type in HANG_TYPES:
                return False
            verdict = await self._absorb_stored(session, job_id, row)
        return verdict is not None and verdict.status is not Status.HEALTHY

    async def _store(self, job_id: str, verdict: Verdict, digest: str, hang: bool = False) -> str:
        async with self.sessions.begin() as session:
            # Other replicas may hold streams of this job: one writer of its diagnosis at a time,
            # and each reads what the one before stored (docs/scale-out.md).
            await locks.hold(session, locks.job(job_id))
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
                    evidence=[],
                    rule_ids=[],
                    affected_ranks=[],
                )
                session.add(row)
            elif not hang:
                verdict = await self._absorb_stored(session, job_id, row) or verdict
            apply(row, verdict, digest)
            row.progress = merged_progress(row.progress, self.stage.progress(job_id))
            await session.flush()
            await set_culprits(session, row.id, row.culprit_nodes)
            await queue_action(session, row, self.action_policy)
        self.changes_by_action[row.action] += 1
        self.hub.publish(DiagnosisView.model_validate(row))
        self.actions_changed()
        if row.action == Action.ESCALATE.value and row.source not in (Source.HUMAN, Source.LLM):
            await self._escalate(job_id, row.id)
        return row.id

    async def _escalate(self, job_id: str, diagnosis_id: str) -> None:
        """Hand an inconclusive diagnosis to the LLM stage; it stays `escalate` meanwhile."""
        if self.escalator is None:
            return
        trace = self.stage.trace(job_id)
        if trace is None or not trace.lines:
            return
        try:
            await self.escalator.submit(diagnosis_id, trace)
        except Exception:  # the diagnosis is stored; a human still sees it as `escalate`
            logger.exception("could not hand diagnosis %s to the LLM stage", diagnosis_id)

    async def apply_llm(self, diagnosis_id: str, job_id: str, record: dict[str, Any]) -> None:
        """The LLM stage's vote on a diagnosis, applied where nothing better has decided since.

        The record is always kept (`llm`), so on-call sees the votes. It changes the verdict
        only when the diagnosis is still open, still `escalate` and not a human's, and only
        when the vote reached the agreement threshold; its action then goes to the outbox like
        a rule's. Cordons were already held to the evidence by the answer check.
        """
        async with self._job_lock(job_id), self.sessions.begin() as session:
            await locks.hold(session, locks.job(job_id))
            row = await session.get(DiagnosisRow, diagnosis_id, populate_existing=True)
            if row is None or row.status not in ACTIVE:
                return
            row.llm = record
            row.updated_at = utcnow()
            decides = (
                record.get("decided") is True
                and record.get("action") != Action.ESCALATE.value
                and row.action == Action.ESCALATE.value
                and row.source != Source.HUMAN
            )
            if decides:
                votes = round(float(record["confidence"]) * int(record["k"]))
                row.failure_type = record["failure_type"]
                row.category = record["category"]
                row.action = record["action"]
                row.culprit_nodes = list(record["culprit_nodes"])
                row.confidence = float(record["confidence"])
                row.source = Source.LLM.value
                row.summary = f"LLM ({votes} of {record['k']} samples agree): {record['summary']}"
            await session.flush()
            if decides:
                await set_culprits(session, row.id, row.culprit_nodes)
                await queue_action(session, row, self.action_policy)
        if decides:
            self.changes_by_action[row.action] += 1
        self.hub.publish(DiagnosisView.model_validate(row))
        self.actions_changed()

    async def _resolve_hang(self, job_id: str, why: str = "progress resumed") -> list[str]:
        """A job reported hung made progress again: its hang diagnosis is resolved, with why.

        A restart it recommended and the operator has not claimed yet is superseded: the job
        runs again without it."""
        async with self.sessions.begin() as session:
            await locks.hold(session, locks.job(job_id))
            row = await active_for_job(session, job_id)
            if row is None or row.failure_type not in HANG_TYPES or row.source == Source.HUMAN:
                return []
            await supersede_pending(session, row.id)
            row.status = DiagnosisStatus.RESOLVED.value
            row.progress = merged_progress(row.progress, self.stage.progress(job_id))
            step = (row.progress or {}).get("last_step")
            row.summary += f" Resolved: {why}{f' (step {step})' if step else ''}."
            row.updated_at = utcnow()
            await session.flush()
        self.hangs["resolved"] += 1
        self.hub.publish(DiagnosisView.model_validate(row))
        self.actions_changed()
        return [row.id]
