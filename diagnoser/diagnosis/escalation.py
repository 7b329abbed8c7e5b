"""The LLM stage's worker: escalations are persisted, queued, asked once, and applied by the flow.

Ingest never waits for it. `submit` writes the escalation (its redacted trace included) and
queues its id without blocking; a full queue leaves it pending in the database, where the sweep
finds it, as it finds everything pending after a restart. A worker asks the LLM through the
verdict cache (one round of k calls per fingerprint, across replicas), then hands the verdict
to the flow, which alone decides what it changes in the diagnosis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from diagnoser.config import LlmSettings
from diagnoser.diagnosis.trace import Trace
from diagnoser.llm import retrieval
from diagnoser.llm.answer import Abstention
from diagnoser.llm.cache import Outcome, VerdictCache
from diagnoser.llm.client import LlmClient
from diagnoser.llm.prompt import Prompts
from diagnoser.llm.redaction import Redactor
from diagnoser.llm.retrieval import covering
from diagnoser.llm.sampling import Asked, ask, vote_record
from diagnoser.store.database import Sessions
from diagnoser.store.escalations import add_escalation, finish_escalation, pending_escalations
from diagnoser.store.history import recent_precedents
from diagnoser.store.models import EscalationRow, utcnow

logger = logging.getLogger(__name__)

ApplyVerdict = Callable[[str, str, dict[str, Any]], Awaitable[None]]
"""(diagnosis_id, job_id, verdict record) -> None: the flow's `apply_llm`."""


AGREEMENT_BUCKETS = (0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass
class LlmCounts:
    """What /metrics exports about the LLM stage (cumulative since start)."""

    calls_ok: int = 0
    calls_failed: int = 0
    cached: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    escalations: int = 0
    refused: int = 0
    """Rounds that made no call: the breaker was open."""
    agreement_buckets: list[int] = field(default_factory=lambda: [0] * len(AGREEMENT_BUCKETS))
    """Rounds whose vote share was at most each bound (cumulative, as Prometheus wants)."""
    agreement_sum: float = 0.0
    agreement_count: int = 0

    def observe(self, asked: Asked) -> None:
        failed = sum(1 for s in asked.samples if isinstance(s, Abstention) and _transport(s))
        self.calls_failed += failed
        if asked.calls == 0:
            self.refused += 1
        self.calls_ok += asked.calls - failed
        self.tokens_in += asked.tokens_in
        self.tokens_out += asked.tokens_out
        share = asked.verdict.confidence
        for index, bound in enumerate(AGREEMENT_BUCKETS):
            if share <= bound + 1e-9:
                self.agreement_buckets[index] += 1
        self.agreement_sum += share
        self.agreement_count += 1


def _transport(abstention: Abstention) -> bool:
    return abstention.reason.startswith(("HTTP", "APITimeoutError", "APIConnectionError"))


def record(asked: Asked, trace: Trace, settings: LlmSettings) -> dict[str, Any]:
    """The verdict as stored with the diagnosis: the vote, its evidence lines, and its cost."""
    return vote_record(asked, trace.lines, settings)


class Escalator:
    def __init__(
        self,
        sessions: Sessions,
        client: LlmClient,
        cache: VerdictCache,
        settings: LlmSettings,
        apply: ApplyVerdict,
        prompts: Prompts | None = None,
    ) -> None:
        self.sessions = sessions
        self.client = client
        self.cache = cache
        self.settings = settings
        self.apply = apply
        self.prompts = prompts or Prompts(settings.prompts_dir)
        self.redactor = Redactor(settings.redact_patterns)
        self.counts = LlmCounts()
        self.queue: asyncio.Queue[int] = asyncio.Queue(settings.queue_size)
        self._queued: set[int] = set()

    async def submit(self, diagnosis_id: str, trace: Trace) -> int:
        """Persist and queue an escalation; never blocks on the LLM."""
        safe = self.redact(trace)
        fingerprint = safe.fingerprint(self.settings.model, self.settings.prompt_version)
        async with self.sessions.begin() as session:
            row = await add_escalation(
                session, diagnosis_id, safe.job_id, fingerprint, safe.to_json()
            )
            escalation_id = row.id
        self.counts.escalations += 1
        self._enqueue(escalation_id)
        return escalation_id

    def redact(self, trace: Trace) -> Trace:
        return trace.redacted(self.redactor)

    async def run(self) -> None:
        """Workers plus the sweep of pending escalations (at start: what a restart left)."""
        async with asyncio.TaskGroup() as group:
            for _ in range(self.settings.workers):
                group.create_task(self._work())
            group.create_task(self._sweep())

    async def handle(self, escalation_id: int) -> None:
        while True:
            async with self.sessions.begin() as session:
                row = await session.get(EscalationRow, escalation_id, populate_existing=True)
                if row is None or row.state != "pending":
                    return
                diagnosis_id, job_id = row.diagnosis_id, row.job_id
                fingerprint, trace = row.fingerprint, Trace.from_json(row.trace)
                quiet_for = (utcnow() - row.updated_at).total_seconds()
            if quiet_for >= self.settings.quiet_s:
                break
            await asyncio.sleep(self.settings.quiet_s - quiet_for)
        try:
            examples = await self.examples(diagnosis_id, trace)
            fingerprint = covering(fingerprint, examples)
            messages = self.prompts.diagnose(
                job_id, trace.lines, examples, version=self.settings.prompt_version
            )

            async def ask_llm() -> Outcome:
                asked = await ask(
                    self.client,
                    messages,
                    trace.checkable,
                    k=self.settings.samples,
                    min_agreement=self.settings.min_agreement,
                    temperature=self.settings.temperature,
                    max_tokens=self.settings.max_tokens,
                )
                self.counts.observe(asked)
                return Outcome(record(asked, trace, self.settings), cacheable=asked.reached)

            result = await self.cache.get_or_ask(
                fingerprint, self.settings.model, self.settings.prompt_version, ask_llm
            )
            if result.cached:
                self.counts.cached += 1
            await self.apply(diagnosis_id, job_id, result.verdict)
        except Exception as exc:
            logger.exception("escalation %s failed", escalation_id)
            async with self.sessions.begin() as session:
                await finish_escalation(session, escalation_id, "failed", repr(exc)[:500])
            return
        async with self.sessions.begin() as session:
            await finish_escalation(session, escalation_id, "done")

    async def examples(self, diagnosis_id: str, trace: Trace) -> list[str]:
        """Similar past diagnoses for the prompt, redacted; none when retrieval fails.

        Asked after the quiet window, so the examples are today's; they are part of the
        question's fingerprint (`retrieval.covering` says why).
        """
        if self.settings.retrieval_examples <= 0:
            return []
        query = [line.text for line in trace.lines if line.flagged] or [
            line.text for line in trace.lines
        ]
        try:
            async with self.sessions() as session:
                candidates = await recent_precedents(
                    session, self.settings.retrieval_candidates, exclude=diagnosis_id
                )
        except Exception:
            logger.exception("retrieval of past diagnoses failed; asking without examples")
            return []
        found = retrieval.examples(query, candidates, self.settings.retrieval_examples)
        return [self.redactor.redact(text).text for text in found]

    def _enqueue(self, escalation_id: int) -> None:
        if escalation_id in self._queued:
            return
        try:
            self.queue.put_nowait(escalation_id)
        except asyncio.QueueFull:
            return  # stays pending in the database; the sweep queues it later
        self._queued.add(escalation_id)

    async def _work(self) -> None:
        while True:
            escalation_id = await self.queue.get()
            try:
                await self.handle(escalation_id)
            except Exception:
                logger.exception("escalation worker failed on %s", escalation_id)
            finally:
                self._queued.discard(escalation_id)

    async def _sweep(self) -> None:
        while True:
            try:
                async with self.sessions.begin() as session:
                    rows = await pending_escalations(session, self.settings.queue_size)
                    ids = [row.id for row in rows]
                for escalation_id in ids:
                    self._enqueue(escalation_id)
            except Exception:
                logger.exception("sweep of pending escalations failed")
            await asyncio.sleep(self.settings.sweep_interval_s)
