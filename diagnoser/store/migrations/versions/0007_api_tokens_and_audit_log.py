"""api_tokens and audit_log: bearer tokens by role (stored hashed) and who changed what

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import diagnoser.store.models

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("jobs", sa.String(length=253), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=253), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
    )
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=253), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=512), nullable=False),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_action"), ["action"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_at"), ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_at"))
        batch_op.drop_index(batch_op.f("ix_audit_log_action"))
    op.drop_table("audit_log")
    op.drop_table("api_tokens")
