"""diagnosis culprits and feedback

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 11:21:21.839666
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import diagnoser.store.models

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "diagnosis_culprits",
        sa.Column("diagnosis_id", sa.String(length=36), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.ForeignKeyConstraint(
            ["diagnosis_id"],
            ["diagnoses.id"],
            name=op.f("fk_diagnosis_culprits_diagnosis_id_diagnoses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("diagnosis_id", "node", name=op.f("pk_diagnosis_culprits")),
    )
    with op.batch_alter_table("diagnosis_culprits", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_diagnosis_culprits_node"), ["node"], unique=False)

    op.create_table(
        "diagnosis_feedback",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("diagnosis_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=True),
        sa.Column("action", sa.String(length=32), nullable=True),
        sa.Column("author", sa.String(length=253), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["diagnosis_id"],
            ["diagnoses.id"],
            name=op.f("fk_diagnosis_feedback_diagnosis_id_diagnoses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_diagnosis_feedback")),
    )
    with op.batch_alter_table("diagnosis_feedback", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_diagnosis_feedback_diagnosis_id"), ["diagnosis_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("diagnosis_feedback", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_diagnosis_feedback_diagnosis_id"))

    op.drop_table("diagnosis_feedback")
    with op.batch_alter_table("diagnosis_culprits", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_diagnosis_culprits_node"))

    op.drop_table("diagnosis_culprits")
