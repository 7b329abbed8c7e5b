"""The action outbox on real SQLite and PostgreSQL: plans, claims, leases, completion, undo."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from diagnoser.actions.kinds import ActionKind, ActionView
from diagnoser.actions.policy import PolicyConfig
from diagnoser.store import actions as outbox
from diagnoser.store.database import (
    Sessions,
    create_service_engine,
    create_sync_engine,
    parse_database_url,
)
from diagnoser.store.diagnoses import queue_action
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import (
    ActionRow,
    DiagnosisRow,
    JobRow,
    LogStreamRow,
    UtcDateTime,
    utcnow,
)

LIVE = PolicyConfig(dry_run=False, verify_failure_types=("nccl_timeout",))
LEASE = timedelta(seconds=60)


async def diagnose(
    sessions: Sessions,
    job: str = "train-1",
    action: str = "cordon_node_and_restart",
    culprits: tuple[str, ...] = ("node-3",),
    failure_type: str = "gpu_fallen_off_bus",
    config: PolicyConfig = LIVE,
    nodes: int = 20,
) -> str:
    """A diagnosis of the job, with its plan written in the same transaction."""
    diagnosis_id = str(uuid.uuid4())
    async with sessions.begin() as session:
        if await session.get(JobRow, job) is None:
            session.add(JobRow(id=job, namespace="ml", kind="PyTorchJob", name=job))
            session.add_all(
                LogStreamRow(job_id=job, stream=f"rank-{i}", node=f"node-{i}", rank=i)
                for i in range(nodes)
            )
            await session.flush()
        row = DiagnosisRow(
            id=diagnosis_id,
            job_id=job,
            status="open",
            failure_type=failure_type,
            category="hardware",
            summary="GPU fell off the bus",
            culprit_nodes=list(culprits),
            source="rule",
            confidence=1.0,
            rule_ids=["gpu-xid-79"],
            evidence=[{"text": "Xid 79 password=hunter2", "node": "node-3"}],
            action=action,
        )
        session.add(row)
        await session.flush()
        await queue_action(session, row, config)
    return diagnosis_id


async def actions_of(sessions: Sessions, diagnosis_id: str) -> list[ActionView]:
    async with sessions() as session:
        rows = await session.scalars(
            select(ActionRow).where(ActionRow.diagnosis_id == diagnosis_id).order_by(ActionRow.id)
        )
        return [ActionView.model_validate(r) for r in rows]


async def claim(
    sessions: Sessions,
    operator: str = "op-a",
    limit: int = 10,
    kinds: list[ActionKind] | None = None,
    now: datetime | None = None,
    max_attempts: int = 5,
) -> list[ActionView]:
    async with sessions.begin() as session:
        rows = await outbox.claim(session, operator, kinds, limit, LEASE, max_attempts, now)
        return [ActionView.model_validate(r) for r in rows]


async def complete(
    sessions: Sessions,
    action_id: int,
    operator: str = "op-a",
    status: str = "done",
    result: dict[str, object] | None = None,
) -> outbox.Completion:
    async with sessions.begin() as session:
        return await outbox.complete(session, action_id, operator, status, "ok", result, LIVE)


async def test_dry_run_records_the_plan_and_releases_nothing(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions, config=PolicyConfig())
    cordon, restart = await actions_of(sessions, diagnosis_id)
    assert (cordon.kind, cordon.state, cordon.released) == ("cordon_node", "pending", False)
    assert cordon.target["node"] == "node-3"
    assert cordon.idempotency_key == f"cordon_node:node-3:{diagnosis_id}"
    assert [d.decision for d in cordon.decisions] == ["dry_run"]
    assert restart.depends_on == [cordon.id]
    assert restart.target["workload_kind"] == "PyTorchJob"
    assert await claim(sessions) == []


async def test_the_restart_is_claimable_once_its_cordons_are_done(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions, culprits=("node-3", "node-4"))
    first = await claim(sessions)
    assert [(a.kind, a.target.get("node")) for a in first] == [
        ("cordon_node", "node-3"),
        ("cordon_node", "node-4"),
    ]
    restart = (await actions_of(sessions, diagnosis_id))[2]
    assert restart.depends_on == [first[0].id, first[1].id]
    await complete(sessions, first[0].id)
    assert await claim(sessions) == []
    await complete(sessions, first[1].id)
    (claimed,) = await claim(sessions)
    assert claimed.kind == "restart_job"
    assert claimed.id == restart.id
    assert claimed.decisions[-2].decision == "released"


async def test_a_failed_cordon_cancels_the_restart_waiting_for_it(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions)
    (cordon,) = await claim(sessions)
    await complete(sessions, cordon.id, status="failed")
    states = [a.state for a in await actions_of(sessions, diagnosis_id)]
    assert states == ["failed", "cancelled"]


async def test_two_operators_claiming_at_once_never_get_the_same_action(
    sessions: Sessions,
) -> None:
    for i in range(30):
        await diagnose(sessions, job=f"job-{i}", action="restart_job", culprits=())

    async def drain(operator: str) -> list[int]:
        got: list[int] = []
        while batch := await claim(sessions, operator, limit=2):
            got += [a.id for a in batch]
            await asyncio.sleep(0)
        return got

    a, b = await asyncio.gather(drain("op-a"), drain("op-b"))
    assert not set(a) & set(b)
    assert len(a) + len(b) == 30


async def test_a_killed_operator_s_action_is_redelivered_after_its_lease(
    sessions: Sessions,
) -> None:
    await diagnose(sessions, action="restart_job", culprits=())
    past = utcnow() - timedelta(minutes=5)
    (leased,) = await claim(sessions, "op-a", now=past)
    assert await claim(sessions, "op-b", now=past + timedelta(seconds=30)) == []
    (again,) = await claim(sessions, "op-b")
    assert again.id == leased.id
    assert again.idempotency_key == leased.idempotency_key
    assert (again.lease_owner, again.attempts) == ("op-b", 2)
    assert "redelivered" in [d.decision for d in again.decisions]
    with pytest.raises(outbox.LeaseConflictError):
        await complete(sessions, leased.id, "op-a")
    assert (await complete(sessions, again.id, "op-b")).action.state == "done"


async def test_completion_is_idempotent(sessions: Sessions) -> None:
    await diagnose(sessions, action="restart_job", culprits=())
    (leased,) = await claim(sessions)
    first = await complete(sessions, leased.id)
    second = await complete(sessions, leased.id)
    assert second.repeated
    assert not first.repeated
    assert ActionView.model_validate(second.action) == ActionView.model_validate(first.action)
    with pytest.raises(outbox.LeaseConflictError):
        await complete(sessions, leased.id, "op-b")
    with pytest.raises(outbox.ActionNotFoundError):
        await complete(sessions, 10_000)


async def test_a_stale_action_expires_instead_of_being_released(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions, action="restart_job", culprits=())
    late = utcnow() + LIVE.expiry + timedelta(seconds=1)
    assert await claim(sessions, now=late) == []
    (action,) = await actions_of(sessions, diagnosis_id)
    assert action.state == "expired"
    assert action.decisions[-1].decision == "expired"


async def test_an_action_whose_leases_keep_running_out_expires(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions, action="restart_job", culprits=())
    start = utcnow() - timedelta(minutes=10)
    for minute in range(3):
        at = start + timedelta(minutes=2 * minute)
        assert len(await claim(sessions, now=at, max_attempts=2)) == (1 if minute < 2 else 0)
    (action,) = await actions_of(sessions, diagnosis_id)
    assert (action.state, action.attempts) == ("expired", 2)


async def test_kinds_filter_leaves_other_kinds_for_other_consumers(sessions: Sessions) -> None:
    await diagnose(sessions, action="escalate", culprits=())
    assert await claim(sessions, kinds=[ActionKind.CORDON_NODE]) == []
    (note,) = await claim(sessions, "notifier", kinds=[ActionKind.NOTIFY])
    assert note.target["audience"] == "oncall"
    assert note.target["evidence"] == ["Xid 79 password=[REDACTED:secret_assignment]"]


async def test_a_newer_diagnosis_supersedes_the_older_pending_plan(sessions: Sessions) -> None:
    older = await diagnose(sessions, culprits=("node-3",))
    newer = await diagnose(sessions, culprits=("node-4",))
    cordon, restart = await actions_of(sessions, older)
    # The older restart is replaced by the newer one; node-3 is still faulty.
    assert (cordon.state, restart.state) == ("pending", "cancelled")
    assert restart.decisions[-1].reason == f"superseded by diagnosis {newer}"
    assert [a.state for a in await actions_of(sessions, newer)] == ["pending", "pending"]


async def test_a_newer_page_leaves_the_older_restart_alone(sessions: Sessions) -> None:
    older = await diagnose(sessions, action="restart_job", culprits=())
    await diagnose(sessions, action="escalate", culprits=())
    assert [a.state for a in await actions_of(sessions, older)] == ["pending"]


async def test_the_same_recommendation_twice_is_one_plan(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions)
    async with sessions.begin() as session:
        row = await session.get(DiagnosisRow, diagnosis_id)
        assert row is not None
        await queue_action(session, row, LIVE)
    assert len(await actions_of(sessions, diagnosis_id)) == 2


async def test_dismissing_a_diagnosis_undoes_its_cordon(sessions: Sessions) -> None:
    diagnosis_id = await diagnose(sessions)
    (cordon,) = await claim(sessions)
    await complete(sessions, cordon.id)
    async with sessions.begin() as session:
        row = await session.get(DiagnosisRow, diagnosis_id)
        assert row is not None
        row.status = "dismissed"
        await outbox.undo_for_feedback(session, row, LIVE, "alice")
    cordon_, restart, undo = await actions_of(sessions, diagnosis_id)
    assert (cordon_.state, restart.state) == ("done", "cancelled")
    assert (undo.kind, undo.target, undo.state) == (
        "uncordon_node",
        {"node": "node-3", "undo_of": cordon.id},
        "pending",
    )
    (claimed,) = await claim(sessions)
    assert claimed.id == undo.id
    # The node was just uncordoned: a new failure there waits out the cooldown.
    quick = replace(LIVE, dedupe_window=timedelta(0))
    again = await diagnose(sessions, job="train-2", culprits=("node-3",), config=quick)
    assert (await actions_of(sessions, again))[0].decisions[0].decision == "cooldown"


async def test_verification_failures_become_cordons_that_the_restart_waits_for(
    sessions: Sessions,
) -> None:
    diagnosis_id = await diagnose(
        sessions, culprits=(), failure_type="nccl_timeout", action="restart_job", nodes=4
    )
    (check,) = await claim(sessions)
    assert check.kind == "verify_nodes"
    assert check.target["nodes"] == ["node-0", "node-1", "node-2", "node-3"]
    await complete(sessions, check.id, result={"failed_nodes": ["node-2"], "rounds": []})
    (cordon,) = await claim(sessions)
    assert (cordon.kind, cordon.target["node"], cordon.diagnosis_id) == (
        "cordon_node",
        "node-2",
        diagnosis_id,
    )
    await complete(sessions, cordon.id)
    (restart,) = await claim(sessions)
    assert restart.kind == "restart_job"
    assert restart.depends_on == [check.id, cordon.id]


async def test_the_blast_radius_holds_across_diagnoses_in_the_database(
    sessions: Sessions,
) -> None:
    """20 known nodes at 10%: two cordons, the rest suppressed, one page."""
    for i in range(5):
        await diagnose(sessions, job=f"job-{i}", culprits=(f"node-{i}",))
    async with sessions() as session:
        rows = list(await session.scalars(select(ActionRow).order_by(ActionRow.id)))
    cordons = [r.state for r in rows if r.kind == "cordon_node"]
    assert cordons == ["pending", "pending", "suppressed", "suppressed", "suppressed"]
    pages = [r for r in rows if r.escalation == "blast_radius"]
    assert len(pages) == 1
    assert pages[0].target["audience"] == "oncall"


async def test_an_opt_out_through_the_store_suppresses_the_cordon(sessions: Sessions) -> None:
    async with sessions.begin() as session:
        await outbox.set_opt_out(session, "node", "node-3", "burn-in", "bob")
    diagnosis_id = await diagnose(sessions)
    cordon, restart = await actions_of(sessions, diagnosis_id)
    assert (cordon.state, cordon.decisions[0].decision) == ("suppressed", "opt_out")
    assert restart.state == "pending"
    assert restart.released
    async with sessions.begin() as session:
        assert await outbox.clear_opt_out(session, "node", "node-3")
        assert not await outbox.clear_opt_out(session, "node", "node-3")


async def test_pages_walk_every_action_once(sessions: Sessions) -> None:
    for i in range(3):
        await diagnose(
            sessions,
            job=f"job-{i}",
            culprits=(f"node-{i}",),
            config=replace(LIVE, blast_radius_percent=100),
        )
    seen: list[int] = []
    cursor = None
    while True:
        async with sessions() as session:
            rows, cursor = await outbox.page(session, outbox.ActionFilter(), 2, cursor)
        seen += [r.id for r in rows]
        if cursor is None:
            break
    assert sorted(seen) == list(range(1, 7))
    async with sessions() as session:
        rows, _ = await outbox.page(session, outbox.ActionFilter(node="node-1"), 10, None)
    assert [r.node for r in rows] == ["node-1"]


def test_rows_written_before_the_policy_stay_readable(database_url: str) -> None:
    db = parse_database_url(database_url)
    upgrade(db, "0005")
    engine = create_sync_engine(db)
    try:
        with engine.begin() as connection:
            now = utcnow()
            stamp = sa.bindparam("now", type_=UtcDateTime())
            connection.execute(
                sa.text(
                    "INSERT INTO jobs (id, lines_received, bytes_received, created_at, "
                    "last_activity_at) VALUES ('j', 0, 0, :now, :now)"
                ).bindparams(stamp),
                {"now": now},
            )
            connection.execute(
                sa.text(
                    "INSERT INTO diagnoses (id, job_id, status, summary, culprit_nodes, "
                    "affected_ranks, source, rule_ids, confidence, evidence, action, "
                    "created_at, updated_at) VALUES ('d', 'j', 'open', '', '[]', '[]', "
                    "'rule', '[]', 1.0, '[]', 'cordon_node_and_restart', :now, :now)"
                ).bindparams(stamp),
                {"now": now},
            )
            for state in ("pending", "superseded"):
                connection.execute(
                    sa.text(
                        "INSERT INTO actions (diagnosis_id, job_id, kind, target_nodes, "
                        "state, attempts, created_at, updated_at) VALUES ('d', 'j', "
                        "'cordon_node_and_restart', '[\"node-3\"]', :state, 0, :now, :now)"
                    ).bindparams(stamp),
                    {"now": now, "state": state},
                )
        upgrade(db)
        with engine.connect() as connection, Session(connection) as session:
            rows = list(session.scalars(select(ActionRow).order_by(ActionRow.id)))
            views = [ActionView.model_validate(r) for r in rows]
    finally:
        engine.dispose()
    assert [(v.kind, v.state, v.target["node"]) for v in views] == [
        ("cordon_node", "expired", "node-3"),
        ("cordon_node", "cancelled", "node-3"),
    ]
    assert views[0].decisions[0].decision == "migrated"


async def test_postgres_claims_skip_rows_another_claim_holds(postgres_url: str) -> None:
    """Operator A's claim is still in its transaction: B gets the next action, without waiting."""
    db = parse_database_url(postgres_url)
    upgrade(db)
    sessions = Sessions(create_service_engine(db), db)
    try:
        for i in range(2):
            await diagnose(sessions, job=f"job-{i}", action="restart_job", culprits=())
        async with sessions.begin() as holding:
            (first,) = await outbox.claim(holding, "op-a", None, 1, LEASE, 5)
            other = await asyncio.wait_for(claim(sessions, "op-b", limit=2), 10)
            assert [a.id for a in other] == [first.id + 1]
    finally:
        await sessions.close()


async def test_the_blast_radius_holds_across_replicas_judging_at_once(postgres_url: str) -> None:
    """Five replicas (five engines) store a cordon each at the same moment: the policy counts
    what the others wrote, so 20 known nodes at 10% still give two cordons, not five."""
    db = parse_database_url(postgres_url)
    upgrade(db)
    replicas = [Sessions(create_service_engine(db), db) for _ in range(5)]
    try:
        async with replicas[0].begin() as session:
            for i in range(5):
                session.add(JobRow(id=f"job-{i}", namespace="ml", kind="PyTorchJob", name="j"))
            await session.flush()
            session.add_all(
                LogStreamRow(job_id=f"job-{i % 5}", stream=f"rank-{i}", node=f"node-{i}", rank=i)
                for i in range(20)
            )
        await asyncio.gather(
            *(
                diagnose(replica, job=f"job-{i}", culprits=(f"node-{i}",))
                for i, replica in enumerate(replicas)
            )
        )
        async with replicas[0]() as session:
            states = list(
                await session.scalars(
                    select(ActionRow.state).where(ActionRow.kind == "cordon_node")
                )
            )
        assert sorted(states) == ["pending", "pending", "suppressed", "suppressed", "suppressed"]
    finally:
        for replica in replicas:
            await replica.close()
