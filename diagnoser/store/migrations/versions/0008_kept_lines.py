"""kept_lines and job_compression: every replica serves a job's compressed log and counts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 13:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import diagnoser.store.models

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "job_compression",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("family", sa.String(length=253), nullable=False),
        sa.Column("lines_in", sa.BigInteger(), nullable=False),
        sa.Column("lines_kept", sa.BigInteger(), nullable=False),
        sa.Column("lines_filtered", sa.BigInteger(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("open_runs", _JSON, nullable=False),
        sa.Column("filtered_by_template", _JSON, nullable=False),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_compression")),
    )
    op.create_table(
        "kept_lines",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("stream", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("line_no", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("template_id", sa.BigInteger(), nullable=False),
        sa.Column("template", sa.Text(), nullable=True),
        sa.Column("guarded", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kept_lines")),
    )
    with op.batch_alter_table("kept_lines", schema=None) as batch_op:
        batch_op.create_index("ix_kept_lines_job_line", ["job_id", "line_no"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("kept_lines", schema=None) as batch_op:
        batch_op.drop_index("ix_kept_lines_job_line")
    op.drop_table("kept_lines")
    op.drop_table("job_compression")
