"""filters: one row per learned filter (replaces the unused filter_sets)

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-01 09:58:27.822789
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import diagnoser.store.models

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "filters",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("family", sa.String(length=253), nullable=True),
        sa.Column("job_id", sa.String(length=253), nullable=True),
        sa.Column("template", sa.Text(), nullable=False),
        sa.Column("pattern", sa.Text(), nullable=False),
        sa.Column("proposer", sa.String(length=16), nullable=False),
        sa.Column(
            "names",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("last_hit_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=True),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_filters")),
    )
    with op.batch_alter_table("filters", schema=None) as batch_op:
        batch_op.create_index("ix_filters_scope_family", ["scope", "family"], unique=False)

    op.drop_table("filter_sets")


def downgrade() -> None:
    op.create_table(
        "filter_sets",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("family", sa.String(length=253), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "patterns",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("jobs_seen", sa.Integer(), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("validated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_filter_sets")),
        sa.UniqueConstraint("family", "version", name=op.f("uq_filter_sets_family")),
    )
    with op.batch_alter_table("filters", schema=None) as batch_op:
        batch_op.drop_index("ix_filters_scope_family")

    op.drop_table("filters")
