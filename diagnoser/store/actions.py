"""The recovery-action outbox: plans written with their diagnosis, claims, leases, completion.

Claims lock rows with `SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL, so concurrent
operators never get the same action; SQLite has one writer (the service's write gate), which
serialises claims. Every function runs inside the caller's transaction: the edge commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, func, or_, select, union
from sqlalchemy.ext.asyncio import AsyncSession

from diagnoser.actions.kinds import (
    ActionKind,
    ActionState,
    VerifyResult,
)
from diagnoser.actions.plans import DiagnosisFacts, PlannedAction, cordon, plan, uncordon
from diagnoser.actions.policy import (
    HOUR,
    History,
    Judged,
    PastAction,
    PolicyConfig,
    Rule,
    judge,
)
from diagnoser.llm.redaction import Redactor
from diagnoser.store import locks
from diagnoser.store.cursor import decode_cursor, encode_cursor
from diagnoser.store.models import (
    ActionOptOutRow,
    ActionRow,
    DiagnosisCulpritRow,
    DiagnosisRow,
    JobRow,
    LogStreamRow,
    utcnow,
)

KIND_VALUES = frozenset(k.value for k in ActionKind)
OPEN_STATES = (ActionState.PENDING.value, ActionState.CLAIMED.value)
EXPIRE_BATCH = 500
SUPERSEDED_KINDS = frozenset({ActionKind.RESTART_JOB, ActionKind.VERIFY_NODES, ActionKind.NOTIFY})
"""Kinds a newer diagnosis of the job replaces; cordons are findings about nodes, and stay."""


class ActionNotFoundError(LookupError):
    pass


class LeaseConflictError(RuntimeError):
    """The action is not (or no longer) leased to this operator."""


def decide(row: ActionRow, decision: str, reason: str, at: datetime | None = None) -> None:
    """Append to the action's audit trail (a new list: the JSON column sees the change)."""
    entry = {"at": (at or utcnow()).isoformat(), "decision": decision, "reason": reason}
    row.decisions = [*(row.decisions or []), entry]


async def facts_of(
    session: AsyncSession, row: DiagnosisRow, base_url: str | None = None
) -> DiagnosisFacts:
    job = await session.get(JobRow, row.job_id)
    nodes = await session.scalars(
        select(LogStreamRow.node).where(LogStreamRow.job_id == row.job_id).distinct()
    )
    redactor = Redactor()
    lines = [
        redactor.redact(str(record.get("text", ""))).text
        for record in (row.evidence or [])[:20]
        if record.get("text")
    ]
    progress = row.progress or {}
    step = progress.get("last_checkpoint_step")
    return DiagnosisFacts(
        id=row.id,
        job_id=row.job_id,
        action=row.action,
        failure_type=row.failure_type,
        category=row.category,
        summary=row.summary or "",
        culprit_nodes=tuple(row.culprit_nodes or ()),
        source=row.source,
        confidence=float(row.confidence or 0.0),
        rule_ids=tuple(row.rule_ids or ()),
        evidence=tuple(lines),
        job_nodes=tuple(sorted(set(nodes))),
        namespace=job.namespace if job else None,
        family=job.family if job else None,
        workload_kind=job.kind if job else None,
        workload_name=job.name if job else None,
        checkpoint_step=int(step) if isinstance(step, int) else None,
        diagnosis_url=f"{base_url.rstrip('/')}/v1/diagnoses/{row.id}" if base_url else None,
    )


async def history(session: AsyncSession, config: PolicyConfig, now: datetime) -> History:
    """What the policy needs from the outbox: every action inside its longest window, every
    open one, the known node count and the API's opt-outs."""
    horizon = now - max(config.blast_radius_window, config.cooldown, config.dedupe_window, HOUR)
    rows = await session.execute(
        select(
            ActionRow.id,
            ActionRow.kind,
            ActionRow.job_id,
            ActionRow.state,
            ActionRow.created_at,
            ActionRow.node,
            ActionRow.escalation,
        ).where(or_(ActionRow.created_at >= horizon, ActionRow.state.in_(OPEN_STATES)))
    )
    past = tuple(
        PastAction(
            kind=ActionKind(kind),
            job_id=job_id,
            state=ActionState(state),
            created_at=created_at,
            node=node,
            escalation=escalation,
            id=action_id,
        )
        for action_id, kind, job_id, state, created_at, node, escalation in rows
        if kind in KIND_VALUES
    )
    known = union(
        select(LogStreamRow.node.label("node")),
        select(DiagnosisCulpritRow.node.label("node")),
    ).subquery()
    count = await session.scalar(select(func.count()).select_from(known))
    opt_outs = list(await session.execute(select(ActionOptOutRow.scope, ActionOptOutRow.name)))
    return History(
        actions=past,
        known_nodes=int(count or 0),
        opted_out_nodes=frozenset(name for scope, name in opt_outs if scope == "node"),
        opted_out_jobs=frozenset(name for scope, name in opt_outs if scope == "job"),
    )


def _row(judged: Judged, config: PolicyConfig, now: datetime) -> ActionRow:
    action, verdict = judged.action, judged.verdict
    row = ActionRow(
        diagnosis_id=action.diagnosis_id,
        job_id=action.job_id,
        kind=action.kind.value,
        target=dict(action.target),
        target_nodes=list(action.nodes),
        node=action.node,
        reason=action.reason,
        source=action.source,
        idempotency_key=action.key,
        state=(ActionState.PENDING if verdict.allowed else ActionState.SUPPRESSED).value,
        escalation=action.escalation,
        depends_on=[],
        decisions=[],
        attempts=0,
        not_before=verdict.not_before,
        expires_at=now + config.expiry,
        created_at=now,
        updated_at=now,
    )
    decide(row, verdict.rule.value, verdict.reason, now)
    return row


async def write_plan(
    session: AsyncSession,
    planned: Sequence[PlannedAction],
    facts: DiagnosisFacts,
    config: PolicyConfig,
    now: datetime,
    known: History | None = None,
) -> list[ActionRow]:
    """Judge the plan and write it; returns the rows written (an existing key: skipped).

    One judge at a time across replicas (`locks.POLICY`, until the caller commits): the blast
    radius, cooldown and budget count the actions written before, including another replica's.
    """
    await locks.hold(session, locks.POLICY)
    keys = [p.key for p in planned]
    existing = set(
        await session.scalars(
            select(ActionRow.idempotency_key).where(ActionRow.idempotency_key.in_(keys))
        )
    )
    fresh = [p for p in planned if p.key not in existing]
    if not fresh:
        return []
    past = known or await history(session, config, now)
    judged = judge(fresh, facts, past, config, now)
    rows = [_row(j, config, now) for j in judged]
    existing_esc = set(
        await session.scalars(
            select(ActionRow.idempotency_key).where(
                ActionRow.idempotency_key.in_([r.idempotency_key for r in rows])
            )
        )
    )
    rows = [r for r in rows if r.idempotency_key not in existing_esc]
    session.add_all(rows)
    await session.flush()
    by_key = {r.idempotency_key: r for r in rows}
    for j in judged:
        row = by_key.get(j.action.key)
        if row is None:
            continue
        # A suppressed prerequisite does not hold the rest back (a node already cordoned,
        # opted out, or over the blast radius: the restart still runs, on-call knows why).
        row.depends_on = [
            dep.id
            for key in j.action.depends_on
            if (dep := by_key.get(key)) is not None and dep.state == ActionState.PENDING.value
        ]
        if j.verdict.released and not row.depends_on:
            row.released_at = now
        elif j.verdict.released:
            decide(row, "waiting", f"released once {_ids(row.depends_on)} are done", now)
    await session.flush()
    return rows


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)


async def cancel_open(
    session: AsyncSession,
    why: str,
    *,
    diagnosis_id: str | None = None,
    job_id: str | None = None,
    exclude_diagnosis: str | None = None,
    kinds: Sequence[ActionKind] | None = None,
    now: datetime | None = None,
) -> list[ActionRow]:
    """Cancel pending actions: never claimed ones (an operator is already at work), never an
    undo (it repairs what a done cordon changed), never the policy's own on-call page."""
    now = now or utcnow()
    query = select(ActionRow).where(
        ActionRow.state == ActionState.PENDING.value,
        ActionRow.kind != ActionKind.UNCORDON_NODE.value,
        ActionRow.escalation.is_(None),
    )
    if kinds is not None:
        query = query.where(ActionRow.kind.in_([k.value for k in kinds]))
    if diagnosis_id is not None:
        query = query.where(ActionRow.diagnosis_id == diagnosis_id)
    if job_id is not None:
        query = query.where(ActionRow.job_id == job_id)
    if exclude_diagnosis is not None:
        query = query.where(ActionRow.diagnosis_id != exclude_diagnosis)
    rows = list(await session.scalars(query))
    for row in rows:
        row.state = ActionState.CANCELLED.value
        row.updated_at = now
        decide(row, "cancelled", why, now)
    await session.flush()
    return rows


async def queue_plan(
    session: AsyncSession,
    row: DiagnosisRow,
    config: PolicyConfig,
    now: datetime | None = None,
    base_url: str | None = None,
) -> list[ActionRow]:
    """The diagnosis's plan, judged and written in the diagnosis's transaction.

    A newer diagnosis of the job supersedes the pending restart, verification and
    notification of older ones when its own plan has one of that kind (a hang reported after
    an older failure leaves that failure's page alone). Older cordons stay: a faulty node stays
    faulty, and dedupe keeps one cordon per node. A changed recommendation of the same
    diagnosis cancels its pending actions that the new plan no longer has.
    """
    now = now or utcnow()
    facts = await facts_of(session, row, base_url)
    planned = plan(facts, config.verify_failure_types)
    keys = {p.key for p in planned}
    replaced = {p.kind for p in planned} & SUPERSEDED_KINDS
    if replaced:
        await cancel_open(
            session,
            f"superseded by diagnosis {row.id}",
            job_id=row.job_id,
            exclude_diagnosis=row.id,
            kinds=sorted(replaced),
            now=now,
        )
    stale = [
        a
        for a in await session.scalars(
            select(ActionRow).where(
                ActionRow.diagnosis_id == row.id,
                ActionRow.state == ActionState.PENDING.value,
                ActionRow.kind != ActionKind.UNCORDON_NODE.value,
                ActionRow.escalation.is_(None),
            )
        )
        if a.idempotency_key not in keys
    ]
    for action in stale:
        action.state = ActionState.CANCELLED.value
        action.updated_at = now
        decide(action, "cancelled", f"the diagnosis now recommends {row.action}", now)
    return await write_plan(session, planned, facts, config, now)


async def undo_for_feedback(
    session: AsyncSession, row: DiagnosisRow, config: PolicyConfig, author: str
) -> list[ActionRow]:
    """The diagnosis was wrong: cancel what has not run, undo each cordon that did."""
    now = utcnow()
    why = f"diagnosis dismissed by {author}"
    changed = await cancel_open(session, why, diagnosis_id=row.id, now=now)
    done = list(
        await session.scalars(
            select(ActionRow).where(
                ActionRow.diagnosis_id == row.id,
                ActionRow.kind == ActionKind.CORDON_NODE.value,
                ActionRow.state == ActionState.DONE.value,
            )
        )
    )
    return changed + await _undo(session, row, done, config, why, now)


async def _undo(
    session: AsyncSession,
    diagnosis: DiagnosisRow,
    cordons: Sequence[ActionRow],
    config: PolicyConfig,
    why: str,
    now: datetime,
) -> list[ActionRow]:
    if not cordons:
        return []
    facts = await facts_of(session, diagnosis)
    undos = [
        uncordon(facts, c.node, c.id, f"undo cordon #{c.id} of {c.node}: {why}")
        for c in cordons
        if c.node is not None and not (c.result or {}).get("skipped")
    ]
    return await write_plan(session, undos, facts, config, now)


async def claim(
    session: AsyncSession,
    operator_id: str,
    kinds: Sequence[ActionKind] | None,
    limit: int,
    lease: timedelta,
    max_attempts: int,
    now: datetime | None = None,
    skip_locked: bool = True,
) -> list[ActionRow]:
    """Lease up to `limit` claimable actions to the operator (oldest first).

    Claimable: pending and released, past `not_before`; or claimed with its lease run out
    (the operator died: redelivered, with the same idempotency key). Past `expires_at`, or
    out of attempts, an action expires instead: a stale action is never released late.
    """
    now = now or utcnow()
    await expire(session, now)
    query: Select[ActionRow] = (
        select(ActionRow)
        .where(
            or_(
                and_(
                    ActionRow.state == ActionState.PENDING.value,
                    ActionRow.released_at.is_not(None),
                    or_(ActionRow.not_before.is_(None), ActionRow.not_before <= now),
                ),
                and_(ActionRow.state == ActionState.CLAIMED.value, ActionRow.lease_until < now),
            )
        )
        .order_by(ActionRow.id)
        .limit(limit)
    )
    if kinds:
        query = query.where(ActionRow.kind.in_([k.value for k in kinds]))
    if skip_locked:
        query = query.with_for_update(skip_locked=True)
    claimed = []
    for row in await session.scalars(query):
        if row.state == ActionState.CLAIMED.value and row.attempts >= max_attempts:
            _expire(row, f"{row.attempts} leases ran out without a completion", now)
            continue
        if row.expires_at is not None and row.expires_at <= now:
            _expire(row, "not claimed before it expired", now)
            continue
        if row.state == ActionState.CLAIMED.value:
            decide(row, "redelivered", f"lease of {row.lease_owner} ran out", now)
        row.state = ActionState.CLAIMED.value
        row.lease_owner = operator_id
        row.lease_until = now + lease
        row.attempts += 1
        row.updated_at = now
        decide(row, "claimed", f"leased to {operator_id} until {row.lease_until.isoformat()}", now)
        claimed.append(row)
    await session.flush()
    return claimed


def _expire(row: ActionRow, why: str, now: datetime) -> None:
    row.state = ActionState.EXPIRED.value
    row.updated_at = now
    row.lease_until = None
    decide(row, "expired", why, now)


async def expire(session: AsyncSession, now: datetime) -> list[ActionRow]:
    """Pending actions past `expires_at` expire (dry-run ones too, and unreleased ones)."""
    query = (
        select(ActionRow)
        .where(
            ActionRow.state == ActionState.PENDING.value,
            ActionRow.expires_at.is_not(None),
            ActionRow.expires_at <= now,
        )
        .order_by(ActionRow.id)
        .limit(EXPIRE_BATCH)
        .with_for_update(skip_locked=True)
    )
    rows = list(await session.scalars(query))
    for row in rows:
        _expire(row, "not released and claimed before it expired", now)
    if rows:
        await session.flush()
    return rows


async def _locked(session: AsyncSession, action_id: int) -> ActionRow:
    row = await session.scalar(select(ActionRow).where(ActionRow.id == action_id).with_for_update())
    if row is None:
        raise ActionNotFoundError(action_id)
    return row


async def extend(
    session: AsyncSession, action_id: int, operator_id: str, lease: timedelta
) -> ActionRow:
    """Renew the lease; only its holder may, and only while nobody else has taken it over."""
    now = utcnow()
    row = await _locked(session, action_id)
    if row.state != ActionState.CLAIMED.value or row.lease_owner != operator_id:
        raise LeaseConflictError(f"action {action_id} is not leased to {operator_id}")
    row.lease_until = now + lease
    row.updated_at = now
    await session.flush()
    return row


@dataclass(frozen=True, slots=True)
class Completion:
    action: ActionRow
    changed: list[ActionRow]
    """Other actions the completion changed (released, cancelled or created)."""
    repeated: bool = False


async def complete(
    session: AsyncSession,
    action_id: int,
    operator_id: str,
    status: str,
    message: str,
    result: dict[str, Any] | None,
    config: PolicyConfig,
) -> Completion:
    """Record the outcome; the same completion again returns the action unchanged.

    Done releases the actions that waited for it, turns a verification's failed nodes into
    cordons (through the policy), and undoes a cordon whose diagnosis was dismissed while it
    ran. Failed cancels what waited for it.
    """
    now = utcnow()
    row = await _locked(session, action_id)
    if row.state in (ActionState.DONE.value, ActionState.FAILED.value):
        if row.lease_owner == operator_id:
            return Completion(row, [], repeated=True)
        raise LeaseConflictError(f"action {action_id} was completed by {row.lease_owner}")
    if row.state != ActionState.CLAIMED.value or row.lease_owner != operator_id:
        raise LeaseConflictError(
            f"action {action_id} is {row.state}"
            + (f", leased to {row.lease_owner}" if row.lease_owner else "")
        )
    row.state = status
    row.message = message
    row.result = result
    row.completed_at = now
    row.updated_at = now
    row.lease_until = None
    decide(row, status, f"{operator_id}: {message}" if message else operator_id, now)
    await session.flush()
    changed = (
        await _after_done(session, row, config, now)
        if status == ActionState.DONE.value
        else await _after_failed(session, row, now)
    )
    return Completion(row, changed)


async def _dependents(session: AsyncSession, row: ActionRow) -> list[ActionRow]:
    pending = await session.scalars(
        select(ActionRow).where(
            ActionRow.diagnosis_id == row.diagnosis_id,
            ActionRow.state == ActionState.PENDING.value,
        )
    )
    return [a for a in pending if row.id in (a.depends_on or [])]


async def _after_failed(session: AsyncSession, row: ActionRow, now: datetime) -> list[ActionRow]:
    waiting = await _dependents(session, row)
    for action in waiting:
        action.state = ActionState.CANCELLED.value
        action.updated_at = now
        decide(action, "cancelled", f"#{row.id} ({row.kind}) failed", now)
    return waiting


async def _after_done(
    session: AsyncSession, row: ActionRow, config: PolicyConfig, now: datetime
) -> list[ActionRow]:
    changed: list[ActionRow] = []
    diagnosis = await session.get(DiagnosisRow, row.diagnosis_id)
    waiting = await _dependents(session, row)
    if row.kind == ActionKind.VERIFY_NODES.value and diagnosis is not None:
        failed = VerifyResult.model_validate(row.result or {}).failed_nodes
        facts = await facts_of(session, diagnosis)
        why = f"failed both rounds of node verification #{row.id}"
        cordons = [cordon(facts, node, f"{node} {why} ({facts.failure_type})") for node in failed]
        created = await write_plan(session, cordons, facts, config, now)
        changed += created
        live = [c.id for c in created if c.state == ActionState.PENDING.value]
        for action in waiting:
            action.depends_on = [*(action.depends_on or []), *live]
    if (
        row.kind == ActionKind.CORDON_NODE.value
        and diagnosis is not None
        and diagnosis.status == "dismissed"
    ):
        changed += await _undo(
            session, diagnosis, [row], config, "its diagnosis was dismissed while it ran", now
        )
    for action in waiting:
        changed.append(action)
        if await _ready(session, action):
            released = (action.decisions or [])[:1]
            if released and released[0].get("decision") == Rule.RELEASED.value:
                action.released_at = now
                action.updated_at = now
                decide(action, "released", "every action it waited for is done", now)
    await session.flush()
    return changed


async def _ready(session: AsyncSession, row: ActionRow) -> bool:
    if not row.depends_on:
        return True
    states = await session.scalars(select(ActionRow.state).where(ActionRow.id.in_(row.depends_on)))
    return all(state == ActionState.DONE.value for state in states)


@dataclass(frozen=True, slots=True)
class ActionFilter:
    job_id: str | None = None
    node: str | None = None
    kind: str | None = None
    state: str | None = None
    diagnosis_id: str | None = None


async def page(
    session: AsyncSession, criteria: ActionFilter, limit: int, cursor: str | None
) -> tuple[list[ActionRow], str | None]:
    """Newest change first, keyset pages on (updated_at, id) like GET /v1/diagnoses."""
    query = select(ActionRow).order_by(ActionRow.updated_at.desc(), ActionRow.id.desc())
    if criteria.job_id:
        query = query.where(ActionRow.job_id == criteria.job_id)
    if criteria.node:
        query = query.where(ActionRow.node == criteria.node)
    if criteria.kind:
        query = query.where(ActionRow.kind == criteria.kind)
    if criteria.state:
        query = query.where(ActionRow.state == criteria.state)
    if criteria.diagnosis_id:
        query = query.where(ActionRow.diagnosis_id == criteria.diagnosis_id)
    if cursor:
        at, text = decode_cursor(cursor)
        # Action ids are integers; a cursor with another id still names a time to page from.
        row_id = int(text) if text.isdigit() and len(text) <= 18 else 0
        query = query.where(
            or_(
                ActionRow.updated_at < at,
                and_(ActionRow.updated_at == at, ActionRow.id < row_id),
            )
        )
    rows = list(await session.scalars(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].updated_at, str(rows[-1].id)) if more else None


async def changed_since(
    session: AsyncSession, since: datetime, limit: int = 500
) -> list[ActionRow]:
    """Actions changed at or after `since`, oldest change first (the stream and the relay)."""
    query = (
        select(ActionRow)
        .where(ActionRow.updated_at >= since)
        .order_by(ActionRow.updated_at, ActionRow.id)
        .limit(limit)
    )
    return list(await session.scalars(query))


async def unpublished(session: AsyncSession, limit: int = 500) -> list[ActionRow]:
    """Released actions the Redis relay has not added to the stream yet.

    Locked until the caller commits, skipping rows another replica's relay holds: two relays
    never add the same action (on SQLite the write gate serialises them).
    """
    query = (
        select(ActionRow)
        .where(ActionRow.released_at.is_not(None), ActionRow.published_at.is_(None))
        .order_by(ActionRow.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(await session.scalars(query))


async def set_opt_out(
    session: AsyncSession, scope: str, name: str, reason: str, author: str
) -> ActionOptOutRow:
    row = await session.get(ActionOptOutRow, (scope, name))
    if row is None:
        row = ActionOptOutRow(scope=scope, name=name, reason=reason, author=author)
        session.add(row)
    else:
        row.reason, row.author = reason, author
    await session.flush()
    return row


async def clear_opt_out(session: AsyncSession, scope: str, name: str) -> bool:
    row = await session.get(ActionOptOutRow, (scope, name))
    if row is None:
        return False
    await session.delete(row)
    await session.flush()
    return True
