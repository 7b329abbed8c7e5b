"""ORM rows for the core entities: jobs, log streams, job events, diagnoses, actions, filters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigId = BigInteger().with_variant(Integer, "sqlite")
"""SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit id."""

Json = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp on both backends (SQLite drops the zone on the way in)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware value")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(253), primary_key=True)
    family: Mapped[str | None] = mapped_column(String(253))
    """Jobs of one family share learned filters (e.g. the same training recipe)."""
    framework: Mapped[str | None] = mapped_column(String(64))
    namespace: Mapped[str | None] = mapped_column(String(253))
    kind: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(253))
    lines_received: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_received: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_activity_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class LogStreamRow(Base):
    """One byte stream of a job; `committed_offset` is what ingest acknowledged, durably."""

    __tablename__ = "log_streams"
    __table_args__ = (UniqueConstraint("job_id", "stream"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    stream: Mapped[str] = mapped_column(String(512))
    node: Mapped[str] = mapped_column(String(253), index=True)
    rank: Mapped[int | None] = mapped_column(Integer)
    committed_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    lines: Mapped[int] = mapped_column(BigInteger, default=0)
    truncated_lines: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class JobEventRow(Base):
    """Lifecycle events (started, heartbeat, exited): exit codes and signals are evidence."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(32))
    node: Mapped[str | None] = mapped_column(String(253))
    rank: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[str | None] = mapped_column(String(32))
    ts: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class DiagnosisRow(Base):
    __tablename__ = "diagnoses"
    __table_args__ = (Index("ix_diagnoses_job_id_created_at", "job_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), index=True)
    failure_type: Mapped[str | None] = mapped_column(String(128))
    category: Mapped[str | None] = mapped_column(String(32), index=True)
    summary: Mapped[str] = mapped_column(Text, default="")
    culprit_nodes: Mapped[list[str]] = mapped_column(Json, default=list)
    affected_ranks: Mapped[list[int]] = mapped_column(Json, default=list)
    source: Mapped[str] = mapped_column(String(16))
    rule_ids: Mapped[list[str]] = mapped_column(Json, default=list)
    confidence: Mapped[float] = mapped_column(Float, default=0.0)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    action: Mapped[str] = mapped_column(String(32))
    progress: Mapped[dict[str, Any] | None] = mapped_column(Json)
    ruleset_digest: Mapped[str | None] = mapped_column(String(64))
    llm: Mapped[dict[str, Any] | None] = mapped_column(Json)
    """Votes, model and prompt version when the LLM stage took part."""
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class DiagnosisCulpritRow(Base):
    """One row per culprit node: lets `GET /v1/nodes` and node filters use an index."""

    __tablename__ = "diagnosis_culprits"

    diagnosis_id: Mapped[str] = mapped_column(
        ForeignKey("diagnoses.id", ondelete="CASCADE"), primary_key=True
    )
    node: Mapped[str] = mapped_column(String(253), primary_key=True, index=True)


class FeedbackRow(Base):
    """An on-call engineer's verdict on a diagnosis; overrides feed evaluation and rule work."""

    __tablename__ = "diagnosis_feedback"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    diagnosis_id: Mapped[str] = mapped_column(
        ForeignKey("diagnoses.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    category: Mapped[str | None] = mapped_column(String(32))
    action: Mapped[str | None] = mapped_column(String(32))
    author: Mapped[str] = mapped_column(String(253))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ActionRow(Base):
    """The outbox of recovery actions: written with its diagnosis, claimed by an operator.

    `released_at` is the policy's yes (null in dry-run and when suppressed); an action is
    claimable when pending, released, its `depends_on` all done, past `not_before` and not
    past `expires_at`, or when claimed with its lease run out. `decisions` is the audit
    trail: every policy and lifecycle decision with its reason.
    """

    __tablename__ = "actions"
    __table_args__ = (Index("ix_actions_state_released_at", "state", "released_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    diagnosis_id: Mapped[str] = mapped_column(
        ForeignKey("diagnoses.id", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[str] = mapped_column(String(253), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    target_nodes: Mapped[list[str]] = mapped_column(Json, default=list)
    state: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(253))
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    """The policy's windows (blast radius, cooldown, budget) read recent actions by it."""
    updated_at: Mapped[datetime] = mapped_column(
        UtcDateTime, default=utcnow, onupdate=utcnow, index=True
    )
    """Pages and the action stream read by it."""
    target: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    node: Mapped[str | None] = mapped_column(String(253), index=True)
    """The node of a cordon or uncordon (indexed for filters and the policy's windows)."""
    reason: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(16), default="rules")
    idempotency_key: Mapped[str] = mapped_column(String(600), unique=True)
    depends_on: Mapped[list[int]] = mapped_column(Json, default=list)
    result: Mapped[dict[str, Any] | None] = mapped_column(Json)
    message: Mapped[str | None] = mapped_column(Text)
    decisions: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    escalation: Mapped[str | None] = mapped_column(String(32))
    """Set on the on-call notifications the policy raises itself (blast radius, budget)."""
    released_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    not_before: Mapped[datetime | None] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    published_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    """When the Redis relay added it to the `diagnoser:actions` stream."""

    @property
    def released(self) -> bool:
        return self.released_at is not None


class ActionOptOutRow(Base):
    """A node or job that recovery actions leave alone (set through the API)."""

    __tablename__ = "action_opt_outs"

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(253), default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class FilterRow(Base):
    """One learned, validated regex filter, shared by every replica and every job of its scope.

    Scope `family` (the default for learned filters: `family` names it), `global` (every
    family) or `job` (`job_id` names it). `template` is the template text it came from; `hits`
    adds up what every replica filtered; `version` grows with each enable or disable.
    """

    __tablename__ = "filters"
    __table_args__ = (Index("ix_filters_scope_family", "scope", "family"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(16))
    family: Mapped[str | None] = mapped_column(String(253))
    job_id: Mapped[str | None] = mapped_column(String(253))
    template: Mapped[str] = mapped_column(Text)
    pattern: Mapped[str] = mapped_column(Text)
    proposer: Mapped[str] = mapped_column(String(16))
    names: Mapped[list[str]] = mapped_column(Json, default=list)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_hit_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class LlmVerdictRow(Base):
    """The LLM's vote on one question (masked trace + model + prompt version), asked once.

    A `pending` row is a claim: the replica that wrote it is asking; the others wait for it to
    become `done`, or take it over once `claimed_at` is older than the lease.
    """

    __tablename__ = "llm_verdicts"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(253))
    prompt_version: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[dict[str, Any] | None] = mapped_column(Json)
    claimed_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class EscalationRow(Base):
    """A diagnosis handed to the LLM stage; persisted so a restart resumes what was pending."""

    __tablename__ = "escalations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    diagnosis_id: Mapped[str] = mapped_column(
        ForeignKey("diagnoses.id", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[str] = mapped_column(String(253))
    fingerprint: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    trace: Mapped[dict[str, Any]] = mapped_column(Json)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class ApiTokenRow(Base):
    """A bearer token (diagnoser/auth/tokens.py): its sha256 digest, never the token itself.

    `node` and `jobs` bind an ingest token: it posts only for that node, for jobs whose id
    matches the glob `jobs`. Revoked and expired rows stay, for the audit trail.
    """

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    node: Mapped[str | None] = mapped_column(String(253))
    jobs: Mapped[str | None] = mapped_column(String(253))
    description: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(253))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class AuditEntryRow(Base):
    """Who (a token id, `cli:<user>`, or `open` when the service runs without tokens) changed
    what, and when: admin changes and action state changes (diagnoser/auth/audit.py)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(253))
    action: Mapped[str] = mapped_column(String(64), index=True)
    subject: Mapped[str] = mapped_column(String(512))
    detail: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)


class JobCompressionRow(Base):
    """A job's compression counts, shared by every replica (they add what they compressed).

    `open_runs` are the filtered runs since the job's last kept line (`[x N lines] <template>`
    not yet closed by one), as the last replica to flush saw them; `truncated` once the stored
    log pruned its middle (`KeptLineRow`)."""

    __tablename__ = "job_compression"

    job_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    family: Mapped[str] = mapped_column(String(253))
    lines_in: Mapped[int] = mapped_column(BigInteger, default=0)
    lines_kept: Mapped[int] = mapped_column(BigInteger, default=0)
    lines_filtered: Mapped[int] = mapped_column(BigInteger, default=0)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    open_runs: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    filtered_by_template: Mapped[dict[str, int]] = mapped_column(Json, default=dict)
    """Template text -> this job's lines its filter dropped (texts: ids are per replica)."""
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class KeptLineRow(Base):
    """One entry of a job's stored compressed log: a kept line, or a run of filtered lines.

    `kind`: `first` (among the first N kept lines of its stream), `guarded` (a failure line, up
    to a cap per job), `novel` (the first kept line of its template in the job, up to a cap),
    `last` (the rest: only the newest N per stream stay), `run` (`count` filtered lines of
    `template_id`, `text` its template). Rows are in `line_no` order (a run's first line)."""

    __tablename__ = "kept_lines"
    __table_args__ = (Index("ix_kept_lines_job_line", "job_id", "line_no"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(253))
    stream: Mapped[str] = mapped_column(String(253))
    node: Mapped[str | None] = mapped_column(String(253))
    rank: Mapped[int | None] = mapped_column(Integer)
    line_no: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(8))
    count: Mapped[int] = mapped_column(BigInteger, default=1)
    text: Mapped[str] = mapped_column(Text)
    template_id: Mapped[int] = mapped_column(BigInteger)
    template: Mapped[str | None] = mapped_column(Text)
    """The template's text, for guarded lines (a storm's label)."""
    guarded: Mapped[str | None] = mapped_column(String(32))


class JobOwnerRow(Base):
    """Which replica owns a job: it alone runs the job's hang detection (docs/scale-out.md).

    A lease: the owner renews `lease_until` every third of it; any replica holding streams of
    the job takes a row whose lease ran out (its owner died or stopped without releasing)."""

    __tablename__ = "job_owners"

    job_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    owner: Mapped[str] = mapped_column(String(253), index=True)
    lease_until: Mapped[datetime] = mapped_column(UtcDateTime)
    taken_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class JobActivityRow(Base):
    """The newest line and step advance one replica saw for a job: the owner's hang detector
    reads every replica's, since the job's streams may be spread over several."""

    __tablename__ = "job_activity"

    job_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    replica: Mapped[str] = mapped_column(String(253), primary_key=True)
    last_line_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_step_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
