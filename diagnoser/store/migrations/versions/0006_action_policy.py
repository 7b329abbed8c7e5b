"""actions: the operator contract (target, reason, idempotency key, lease, decisions) and opt-outs

Rows written before the policy existed were never released to anyone: they are kept,
readable, as `expired` (pending) or `cancelled` (superseded), with a decision saying why.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 11:50:00.000000
"""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

import diagnoser.store.models
from diagnoser.store.models import Json

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UtcDateTime = diagnoser.store.models.UtcDateTime
JSON_TYPE = Json
TAINT_KEY = "diagnoser.io/faulty"


def _legacy(row: Any, now: datetime) -> dict[str, Any]:
    nodes = list(row.target_nodes or [])
    if row.kind == "cordon_node_and_restart" and nodes:
        kind = "cordon_node"
        target: dict[str, Any] = {
            "node": nodes[0],
            "failure_type": None,
            "taint_key": TAINT_KEY,
            "taint_value": "unknown",
            "taint_effect": "NoSchedule",
        }
        node = nodes[0]
    else:
        kind = "restart_job"
        target = {"namespace": None, "workload_kind": None, "name": None, "resume_from_step": None}
        node = None
    state = {"pending": "expired", "superseded": "cancelled"}.get(row.state, row.state)
    return {
        "id": row.id,
        "kind": kind,
        "target": target,
        "node": node,
        "state": state,
        "reason": f"planned as {row.kind} before the action policy",
        "source": "rules",
        "idempotency_key": f"legacy:{row.id}",
        "depends_on": [],
        "decisions": [
            {
                "at": now.isoformat(),
                "decision": "migrated",
                "reason": "written before the action policy (migration 0006): never released",
            }
        ],
    }


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target", JSON_TYPE, nullable=True))
        batch_op.add_column(sa.Column("node", sa.String(length=253), nullable=True))
        batch_op.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("source", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=600), nullable=True))
        batch_op.add_column(sa.Column("depends_on", JSON_TYPE, nullable=True))
        batch_op.add_column(sa.Column("result", JSON_TYPE, nullable=True))
        batch_op.add_column(sa.Column("message", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("decisions", JSON_TYPE, nullable=True))
        batch_op.add_column(sa.Column("escalation", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("released_at", UtcDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("not_before", UtcDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("expires_at", UtcDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("completed_at", UtcDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("published_at", UtcDateTime(timezone=True), nullable=True))

    connection = op.get_bind()
    actions = sa.table(
        "actions",
        sa.column("id", sa.Integer),
        sa.column("kind", sa.String),
        sa.column("target_nodes", Json),
        sa.column("state", sa.String),
        sa.column("target", Json),
        sa.column("node", sa.String),
        sa.column("reason", sa.Text),
        sa.column("source", sa.String),
        sa.column("idempotency_key", sa.String),
        sa.column("depends_on", Json),
        sa.column("decisions", Json),
    )
    now = datetime.now(UTC)
    rows = list(
        connection.execute(
            sa.select(actions.c.id, actions.c.kind, actions.c.target_nodes, actions.c.state)
        )
    )
    for row in rows:
        values = _legacy(row, now)
        connection.execute(
            actions.update().where(actions.c.id == values.pop("id")).values(**values)
        )

    with op.batch_alter_table("actions", schema=None) as batch_op:
        for name in ("target", "reason", "source", "idempotency_key", "depends_on", "decisions"):
            batch_op.alter_column(name, nullable=False)
        batch_op.create_index(batch_op.f("ix_actions_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_updated_at"), ["updated_at"], unique=False)
        batch_op.create_index(
            "ix_actions_state_released_at", ["state", "released_at"], unique=False
        )
        batch_op.create_unique_constraint(
            batch_op.f("uq_actions_idempotency_key"), ["idempotency_key"]
        )

    op.create_table(
        "action_opt_outs",
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=253), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "name", name=op.f("pk_action_opt_outs")),
    )


def downgrade() -> None:
    op.drop_table("action_opt_outs")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_actions_idempotency_key"), type_="unique")
        batch_op.drop_index("ix_actions_state_released_at")
        batch_op.drop_index(batch_op.f("ix_actions_updated_at"))
        batch_op.drop_index(batch_op.f("ix_actions_created_at"))
        batch_op.drop_index(batch_op.f("ix_actions_node"))
        for name in (
            "published_at",
            "completed_at",
            "expires_at",
            "not_before",
            "released_at",
            "escalation",
            "decisions",
            "message",
            "result",
            "depends_on",
            "idempotency_key",
            "source",
            "reason",
            "node",
            "target",
        ):
            batch_op.drop_column(name)
