"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 10:55:46.367723
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import diagnoser.store.models

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
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
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=253), nullable=False),
        sa.Column("family", sa.String(length=253), nullable=True),
        sa.Column("framework", sa.String(length=64), nullable=True),
        sa.Column("namespace", sa.String(length=253), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=253), nullable=True),
        sa.Column("lines_received", sa.BigInteger(), nullable=False),
        sa.Column("bytes_received", sa.BigInteger(), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column(
            "last_activity_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_jobs_last_activity_at"), ["last_activity_at"], unique=False
        )

    op.create_table(
        "diagnoses",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("failure_type", sa.String(length=128), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column(
            "culprit_nodes",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "affected_ranks",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column(
            "rule_ids",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column(
            "progress",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("ruleset_digest", sa.String(length=64), nullable=True),
        sa.Column(
            "llm",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_diagnoses_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_diagnoses")),
    )
    with op.batch_alter_table("diagnoses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_diagnoses_category"), ["category"], unique=False)
        batch_op.create_index(
            "ix_diagnoses_job_id_created_at", ["job_id", "created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_diagnoses_status"), ["status"], unique=False)

    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.String(length=32), nullable=True),
        sa.Column("ts", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("received_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "log_streams",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("stream", sa.String(length=512), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("committed_offset", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.BigInteger(), nullable=False),
        sa.Column("truncated_lines", sa.BigInteger(), nullable=False),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_log_streams_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_streams")),
        sa.UniqueConstraint("job_id", "stream", name=op.f("uq_log_streams_job_id")),
    )
    with op.batch_alter_table("log_streams", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_log_streams_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_log_streams_node"), ["node"], unique=False)

    op.create_table(
        "actions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("diagnosis_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column(
            "target_nodes",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=253), nullable=True),
        sa.Column("lease_until", diagnoser.store.models.UtcDateTime(timezone=True), nullable=True),
        sa.Column("created_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", diagnoser.store.models.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["diagnosis_id"],
            ["diagnoses.id"],
            name=op.f("fk_actions_diagnosis_id_diagnoses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_actions")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_actions_diagnosis_id"), ["diagnosis_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_actions_state"))
        batch_op.drop_index(batch_op.f("ix_actions_job_id"))
        batch_op.drop_index(batch_op.f("ix_actions_diagnosis_id"))

    op.drop_table("actions")
    with op.batch_alter_table("log_streams", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_log_streams_node"))
        batch_op.drop_index(batch_op.f("ix_log_streams_job_id"))

    op.drop_table("log_streams")
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_events_job_id"))

    op.drop_table("job_events")
    with op.batch_alter_table("diagnoses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_diagnoses_status"))
        batch_op.drop_index("ix_diagnoses_job_id_created_at")
        batch_op.drop_index(batch_op.f("ix_diagnoses_category"))

    op.drop_table("diagnoses")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_last_activity_at"))

    op.drop_table("jobs")
    op.drop_table("filter_sets")
