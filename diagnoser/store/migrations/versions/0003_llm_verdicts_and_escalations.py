"""llm verdicts and escalations

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 08:41:50.445993
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import diagnoser.store.models

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "llm_verdicts",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("prompt_version", sa.String(length=64), nullable=False),
        sa.Column(
            "verdict",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("claimed_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_llm_verdicts")),
    )
    op.create_table(
        "escalations",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("diagnosis_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column(
            "trace",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["diagnosis_id"],
            ["diagnoses.id"],
            name=op.f("fk_escalations_diagnosis_id_diagnoses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_escalations")),
    )
    with op.batch_alter_table("escalations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_escalations_diagnosis_id"), ["diagnosis_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_escalations_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("escalations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_escalations_state"))
        batch_op.drop_index(batch_op.f("ix_escalations_diagnosis_id"))

    op.drop_table("escalations")
    op.drop_table("llm_verdicts")
