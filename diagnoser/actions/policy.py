"""Whether a planned action may run: a pure function of (history, plan, config, now).

Checks, in order, each with its reason recorded on the action:
opt-out (node or job) -> low LLM agreement (node actions) -> dedupe -> per-node cooldown ->
blast radius (node actions) -> restart budget and backoff -> dry-run.

The blast radius is a sliding window over distinct nodes: at most max(1, P% of the known
nodes) cordoned within W. Past it the breaker is tripped: further node actions are
suppressed and on-call gets one escalation per trip (none while an earlier escalation is
still inside the window). History comes from the database, so a restart of the service does
not re-arm a storm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from diagnoser.actions.kinds import NODE_KINDS, ActionKind, ActionState, Audience
from diagnoser.actions.plans import DiagnosisFacts, PlannedAction, notify
from diagnoser.config import ActionSettings

LIVE_STATES = frozenset({ActionState.PENDING, ActionState.CLAIMED, ActionState.DONE})
"""States of an action that has happened or may still happen (counted by every window)."""
HOUR = timedelta(hours=1)


class Rule(StrEnum):
    RELEASED = "released"
    DRY_RUN = "dry_run"
    OPT_OUT = "opt_out"
    LOW_AGREEMENT = "low_agreement"
    DUPLICATE = "duplicate"
    COOLDOWN = "cooldown"
    BLAST_RADIUS = "blast_radius"
    RESTART_BUDGET = "restart_budget"


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    dry_run: bool = True
    blast_radius_percent: float = 10.0
    blast_radius_window: timedelta = HOUR
    cooldown: timedelta = HOUR
    dedupe_window: timedelta = timedelta(minutes=10)
    restart_budget: int = 3
    restart_backoff: timedelta = timedelta(minutes=1)
    min_agreement: float = 0.8
    opt_out_nodes: frozenset[str] = frozenset()
    opt_out_jobs: frozenset[str] = frozenset()
    verify_failure_types: tuple[str, ...] = ()
    expiry: timedelta = HOUR

    @classmethod
    def from_settings(cls, actions: ActionSettings, min_agreement: float) -> PolicyConfig:
        """`min_agreement` is the LLM stage's own threshold (LlmSettings.min_agreement)."""
        return cls(
            dry_run=actions.dry_run,
            blast_radius_percent=actions.blast_radius_percent,
            blast_radius_window=timedelta(seconds=actions.blast_radius_window_s),
            cooldown=timedelta(seconds=actions.cooldown_s),
            dedupe_window=timedelta(seconds=actions.dedupe_window_s),
            restart_budget=actions.restart_budget,
            restart_backoff=timedelta(seconds=actions.restart_backoff_s),
            min_agreement=min_agreement,
            opt_out_nodes=frozenset(actions.opt_out_nodes),
            opt_out_jobs=frozenset(actions.opt_out_jobs),
            verify_failure_types=tuple(actions.verify_failure_types),
            expiry=timedelta(seconds=actions.expiry_s),
        )

    def cap(self, known_nodes: int) -> int:
        return max(1, math.floor(known_nodes * self.blast_radius_percent / 100))


@dataclass(frozen=True, slots=True)
class PastAction:
    """An action already in the outbox, as the policy sees it."""

    kind: ActionKind
    job_id: str
    state: ActionState
    created_at: datetime
    node: str | None = None
    escalation: str | None = None
    id: int | None = None


@dataclass(frozen=True, slots=True)
class History:
    actions: tuple[PastAction, ...] = ()
    known_nodes: int = 0
    """Distinct nodes the service has seen (log streams, culprits): the blast radius base."""
    opted_out_nodes: frozenset[str] = frozenset()
    """Opt-outs made through the API (the settings' lists are in PolicyConfig)."""
    opted_out_jobs: frozenset[str] = frozenset()

    def adding(self, action: PastAction) -> History:
        return replace(self, actions=(*self.actions, action))


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: Rule
    reason: str
    not_before: datetime | None = None

    @property
    def allowed(self) -> bool:
        """Released, or would be outside dry-run: the action stays `pending`."""
        return self.rule in (Rule.RELEASED, Rule.DRY_RUN)

    @property
    def released(self) -> bool:
        return self.rule is Rule.RELEASED


@dataclass(frozen=True, slots=True)
class Judged:
    action: PlannedAction
    verdict: Verdict


def _live(history: History, since: datetime, kinds: Iterable[ActionKind]) -> list[PastAction]:
    wanted = set(kinds)
    return [
        a
        for a in history.actions
        if a.kind in wanted and a.state in LIVE_STATES and a.created_at >= since
    ]


def _cordoned_nodes(history: History, since: datetime) -> set[str]:
    return {
        a.node
        for a in _live(history, since, [ActionKind.CORDON_NODE])
        if a.node is not None and a.escalation is None
    }


def tripped(history: History, config: PolicyConfig, now: datetime) -> bool:
    """The blast-radius breaker: the window already holds the cap of cordoned nodes."""
    cordoned = _cordoned_nodes(history, now - config.blast_radius_window)
    return len(cordoned) >= config.cap(history.known_nodes)


def _escalated(history: History, why: str, job_id: str | None, since: datetime) -> bool:
    return any(
        a.kind is ActionKind.NOTIFY
        and a.escalation == why
        and (job_id is None or a.job_id == job_id)
        and a.state is not ActionState.CANCELLED
        and a.created_at >= since
        for a in history.actions
    )


def evaluate(
    action: PlannedAction, history: History, config: PolicyConfig, now: datetime
) -> Verdict:
    """The verdict on one action, given everything already in the outbox."""
    nodes = set(action.nodes)
    if action.kind is not ActionKind.NOTIFY and action.kind is not ActionKind.UNCORDON_NODE:
        if action.job_id in config.opt_out_jobs | history.opted_out_jobs:
            return Verdict(Rule.OPT_OUT, f"job {action.job_id} opted out of recovery actions")
        opted = nodes & (config.opt_out_nodes | history.opted_out_nodes)
        if opted and action.kind is ActionKind.CORDON_NODE:
            return Verdict(Rule.OPT_OUT, f"node {', '.join(sorted(opted))} opted out")
    low = action.source == "llm" and action.confidence < config.min_agreement
    if action.kind in NODE_KINDS and low:
        return Verdict(
            Rule.LOW_AGREEMENT,
            f"LLM agreement {action.confidence:.2f} below {config.min_agreement:.2f}: "
            "no node action on its word",
        )
    verdict = _dedupe(action, history, config, now)
    if verdict is not None:
        return verdict
    if action.kind is ActionKind.CORDON_NODE and action.node is not None:
        recent = [
            a
            for a in _live(history, now - config.cooldown, [ActionKind.UNCORDON_NODE])
            if a.node == action.node
        ]
        cordons = [
            a
            for a in _live(history, now - config.cooldown, [ActionKind.CORDON_NODE])
            if a.node == action.node and a.state is ActionState.DONE
        ]
        if recent or cordons:
            last = max(a.created_at for a in recent + cordons)
            return Verdict(
                Rule.COOLDOWN,
                f"node {action.node} was cordoned or uncordoned at {last.isoformat()}, "
                f"within the {config.cooldown} cooldown",
            )
    if action.kind in NODE_KINDS and tripped(history, config, now):
        cap = config.cap(history.known_nodes)
        return Verdict(
            Rule.BLAST_RADIUS,
            f"blast radius: {cap} of {history.known_nodes} known nodes already cordoned "
            f"within {config.blast_radius_window}",
        )
    not_before = None
    if action.kind is ActionKind.RESTART_JOB:
        done = sorted(
            (
                a
                for a in _live(history, now - HOUR, [ActionKind.RESTART_JOB])
                if a.job_id == action.job_id
            ),
            key=lambda a: a.created_at,
        )
        if len(done) >= config.restart_budget:
            return Verdict(
                Rule.RESTART_BUDGET,
                f"{len(done)} restarts of {action.job_id} within the hour "
                f"(budget {config.restart_budget}): on-call decides",
            )
        if done:
            wait = config.restart_backoff * 2 ** (len(done) - 1)
            due = done[-1].created_at + wait
            not_before = due if due > now else None
    if config.dry_run:
        return Verdict(Rule.DRY_RUN, "dry-run: recorded, not released", not_before)
    return Verdict(Rule.RELEASED, "allowed by the policy", not_before)


def _dedupe(
    action: PlannedAction, history: History, config: PolicyConfig, now: datetime
) -> Verdict | None:
    """The node or job already has this kind of action pending or claimed (or, for a cordon,
    done within the dedupe window)."""
    if action.kind not in (ActionKind.CORDON_NODE, ActionKind.RESTART_JOB):
        return None
    since = now - config.dedupe_window
    for past in history.actions:
        if past.kind is not action.kind or past.escalation is not None:
            continue
        same = (
            past.node == action.node
            if action.kind is ActionKind.CORDON_NODE
            else past.job_id == action.job_id
        )
        open_ = past.state in (ActionState.PENDING, ActionState.CLAIMED)
        # A done restart is a new attempt: its next failure is budgeted, not a duplicate.
        recent = (
            action.kind is ActionKind.CORDON_NODE
            and past.state is ActionState.DONE
            and past.created_at >= since
        )
        if same and (open_ or recent):
            what = f"node {action.node}" if action.node else f"job {action.job_id}"
            ref = f"#{past.id}" if past.id is not None else "an earlier action of this plan"
            return Verdict(Rule.DUPLICATE, f"{what} already has {ref} ({past.state.value})")
    return None


def judge(
    plan: Sequence[PlannedAction],
    facts: DiagnosisFacts,
    history: History,
    config: PolicyConfig,
    now: datetime,
) -> list[Judged]:
    """Verdicts on a whole plan, in order; each allowed action counts for the next ones.

    Adds the on-call escalations the policy raises itself: one when the blast radius trips
    (per trip) and one when a job's restart budget is spent (per job per hour).
    """
    judged: list[Judged] = []
    for action in plan:
        verdict = evaluate(action, history, config, now)
        judged.append(Judged(action, verdict))
        state = ActionState.PENDING if verdict.allowed else ActionState.SUPPRESSED
        history = history.adding(
            PastAction(action.kind, action.job_id, state, now, action.node, action.escalation)
        )
        escalation = _escalation(action, verdict, facts, history, config, now)
        if escalation is not None:
            esc_verdict = Verdict(
                Rule.DRY_RUN if config.dry_run else Rule.RELEASED,
                f"policy escalation ({escalation.escalation})",
            )
            judged.append(Judged(escalation, esc_verdict))
            history = history.adding(
                PastAction(
                    ActionKind.NOTIFY,
                    action.job_id,
                    ActionState.PENDING,
                    now,
                    escalation=escalation.escalation,
                )
            )
    return judged


def _escalation(
    action: PlannedAction,
    verdict: Verdict,
    facts: DiagnosisFacts,
    history: History,
    config: PolicyConfig,
    now: datetime,
) -> PlannedAction | None:
    if verdict.rule is Rule.BLAST_RADIUS:
        if _escalated(history, Rule.BLAST_RADIUS, None, now - config.blast_radius_window):
            return None
        return notify(
            facts,
            Audience.ONCALL,
            f"recovery breaker tripped: {verdict.reason}; further node actions are suppressed "
            "until the window slides (docs/actions.md)",
            key=f"notify:oncall:blast_radius:{facts.id}:{action.key}",
            escalation=Rule.BLAST_RADIUS,
        )
    if verdict.rule is Rule.RESTART_BUDGET:
        if _escalated(history, Rule.RESTART_BUDGET, action.job_id, now - HOUR):
            return None
        return notify(
            facts,
            Audience.ONCALL,
            f"restart budget spent: {verdict.reason}",
            key=f"notify:oncall:restart_budget:{facts.id}",
            escalation=Rule.RESTART_BUDGET,
        )
    return None
