"""job_owners and job_activity: one hang detector per job across replicas

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import diagnoser.store.models

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIME = diagnoser.store.models.UtcDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_owners",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("owner", sa.String(length=253), nullable=False),
        sa.Column("lease_until", _TIME, nullable=False),
        sa.Column("taken_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_owners")),
    )
    with op.batch_alter_table("job_owners", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_owners_owner"), ["owner"], unique=False)
    op.create_table(
        "job_activity",
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("replica", sa.String(length=253), nullable=False),
        sa.Column("last_line_at", _TIME, nullable=False),
        sa.Column("last_step_at", _TIME, nullable=True),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "replica", name=op.f("pk_job_activity")),
    )


def downgrade() -> None:
    op.drop_table("job_activity")
    with op.batch_alter_table("job_owners", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_owners_owner"))
    op.drop_table("job_owners")
