"""Settings: one object, built once at an entry point and passed down.

Every value comes from `DIAGNOSER_*` environment variables (nested groups use `__`, e.g.
`DIAGNOSER_DB__URL`) or from explicit keyword arguments, which tests use instead of env vars.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from diagnoser.templates.signals import SignalConfig

SQLITE_FILE_NAME = "diagnoser.db"
SOURCE_RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
"""The shipped pack in a source checkout; containers set DIAGNOSER_RULES_DIR instead."""
SOURCE_PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
PACKAGED_PROMPTS_DIR = Path(__file__).resolve().parent / "llm" / "prompts"
PACKAGED_RULES_DIR = Path(__file__).resolve().parent / "rules" / "pack"
"""The copy of the same pack that a built wheel carries (setup.py puts it there)."""


def default_rules_dir() -> Path:
    """The source tree's pack when running from a checkout, else the installed package's copy.

    A checkout is recognised by its pyproject.toml too: an installed diagnoser sits beside
    whatever else is in site-packages, which may well include a directory named `rules`.
    """
    checkout = SOURCE_RULES_DIR.parent
    if (checkout / "pyproject.toml").is_file() and SOURCE_RULES_DIR.is_dir():
        return SOURCE_RULES_DIR
    return PACKAGED_RULES_DIR


def default_prompts_dir() -> Path:
    """Like the rule pack: the checkout's `prompts/`, else the installed package's copy."""
    if (SOURCE_PROMPTS_DIR.parent / "pyproject.toml").is_file() and SOURCE_PROMPTS_DIR.is_dir():
        return SOURCE_PROMPTS_DIR
    return PACKAGED_PROMPTS_DIR


class DbSettings(BaseModel):
    url: str | None = None
    """SQLAlchemy URL; None means the embedded SQLite file in the data directory."""
    pool_size: int = Field(default=10, ge=1)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    echo: bool = False


class RedisSettings(BaseModel):
    url: str | None = None
    """Optional; without it everything runs in-process. Empty means unset, as compose passes it."""
    socket_timeout_s: float = Field(default=2.0, gt=0)

    @field_validator("url")
    @classmethod
    def _empty_is_unset(cls, url: str | None) -> str | None:
        return url or None


class LlmSettings(BaseModel):
    base_url: str | None = None
    """Any OpenAI-compatible endpoint; None disables the LLM stage."""
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    samples: int = Field(default=5, ge=1, le=20)
    """k: answers sampled per escalation (self-consistency), each a seeded request."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    max_tokens: int = Field(default=512, ge=16, le=8192)
    """Cap on each sample's answer: a model that rambles stops here (the answer is then
    unreadable and counts as an abstention), bounding the time and cost of one ask."""
    min_agreement: float = Field(default=0.8, gt=0, le=1)
    """Share of the k samples the winning answer needs; below it a human decides."""
    prompt_version: str = Field(default="diagnose.v1", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    prompts_dir: Path = Field(default_factory=default_prompts_dir)
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive failed calls that open the circuit breaker."""
    breaker_reset_s: float = Field(default=30.0, gt=0)
    """How long an open breaker refuses calls before one trial goes through."""
    quiet_s: float = Field(default=5.0, ge=0)
    """An escalation is asked once its trace has been quiet this long (a storm settles first)."""
    workers: int = Field(default=2, ge=1, le=64)
    queue_size: int = Field(default=256, ge=1)
    sweep_interval_s: float = Field(default=30.0, gt=0)
    """How often pending escalations are looked for in the database: a restart's leftovers,
    a full queue's, and a dead replica's (docs/scale-out.md)."""
    redact_patterns: list[str] = Field(default_factory=list)
    """Extra regexes whose matches are removed before text leaves for the LLM."""
    retrieval_examples: int = Field(default=3, ge=0, le=10)
    """Similar past diagnoses (decided by rules or by people) shown to the model; 0 disables."""
    retrieval_candidates: int = Field(default=200, ge=1, le=5000)
    """How many of the most recent such diagnoses retrieval compares (bounded work per ask)."""
    suggest_after: int = Field(default=3, ge=1, le=1000)
    """Jobs the LLM must have resolved alike before their failure is suggested as a rule."""
    log_agent: bool = True
    """Ask the LLM for filters of templates the deterministic proposer could not filter."""
    log_agent_interval_s: float = Field(default=5.0, gt=0)
    """How often the Log Agent offers every family's pending templates to its queue."""

    @field_validator("base_url")
    @classmethod
    def _empty_is_unset(cls, url: str | None) -> str | None:
        """`DIAGNOSER_LLM__BASE_URL=` (as compose files pass an unset variable) means no LLM."""
        return url or None

    @property
    def enabled(self) -> bool:
        return self.base_url is not None


class IngestSettings(BaseModel):
    max_line_bytes: int = Field(default=64 * 1024, ge=256)
    """Longer lines are truncated with a visible marker and counted."""
    max_json_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """NDJSON and JSON bodies are parsed whole, so they are capped (413 above it)."""
    idle_timeout_s: float = Field(default=60.0, gt=0)
    """A request body that sends nothing for this long is committed and closed (408)."""
    commit_every_bytes: int = Field(default=1024 * 1024, ge=1)
    commit_every_s: float = Field(default=1.0, gt=0)
    """A long-lived upload commits its offset at least this often, so a crash loses little."""
    max_concurrent_requests: int = Field(default=512, ge=1)
    """Ingest requests in flight at once; beyond it clients get 429 with Retry-After."""


NOT_IMPLEMENTED = "not_implemented"
"""Error type of a setting that names a feature that does not exist yet."""


class AuthSettings(BaseModel):
    """Bearer tokens by role: see docs/security.md."""

    enabled: bool | None = None
    """Unset: protected as soon as a token exists; with none, open on loopback only (with a
    warning) and refused on any other address. `true`: tokens required, so a start with none is
    refused. `false`: open, which only a loopback address accepts."""
    open_health: bool = True
    """`/healthz` and `/readyz` answer without a token (load balancers and probes send none)."""
    open_metrics: bool = True
    """`/metrics` answers without a token (Prometheus scrapes send none by default)."""
    token_cache_s: float = Field(default=30.0, ge=0, le=300)
    """A token verified this recently is not looked up again (0: every request reads the
    database). A token revoked on another replica or with `diagnoser token revoke` stops
    working within this many seconds; revoked through this replica's API, at once. Longer
    than a shipper's upload (about 10 s), so that a node's next upload finds its token."""


class LimitSettings(BaseModel):
    """Caps on what one request may carry; each one answers a JSON error (docs/security.md)."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Bodies of every route but the log upload (which streams and has its own caps): 413."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """All request headers together: 431."""
    max_query_bytes: int = Field(default=4096, ge=256)
    """The query string: 414."""
    max_json_depth: int = Field(default=32, ge=2, le=256)
    """Nesting of a JSON body (arrays and objects): 400."""
    max_json_items: int = Field(default=10_000, ge=1)
    """Members of any one JSON array or object in such a body: 413."""
    keep_alive_s: int = Field(default=5, ge=1)
    """An idle keep-alive connection is closed after this long."""
    max_connections: int = Field(default=4096, ge=1)
    """Open connections at once; beyond it new requests get 503 (slow clients cannot pile up)."""


class ActionSettings(BaseModel):
    """The recovery-action policy: see diagnoser/actions/policy.py and docs/actions.md."""

    dry_run: bool = True
    """Shadow mode: every action is planned, judged by the policy and recorded (visible in
    GET /v1/actions), but none is released to an operator. `false` releases what the policy
    allows."""
    blast_radius_percent: float = Field(default=10.0, gt=0, le=100)
    """At most max(1, this share of the known nodes) cordoned within `blast_radius_window_s`;
    beyond it further node actions are suppressed and on-call is paged once."""
    blast_radius_window_s: float = Field(default=3600.0, gt=0)
    cooldown_s: float = Field(default=3600.0, ge=0)
    """A node cordoned (or uncordoned after feedback) is not cordoned again for this long."""
    dedupe_window_s: float = Field(default=600.0, ge=0)
    """A cordon of a node done within this window makes a new one a duplicate (an open
    cordon or restart always does)."""
    restart_budget: int = Field(default=3, ge=0)
    """Restarts per job per hour; past it the plan pages on-call instead of restarting."""
    restart_backoff_s: float = Field(default=60.0, ge=0)
    """The n-th restart of a job within the hour waits this times 2^(n-1) after the previous."""
    expiry_s: float = Field(default=3600.0, gt=0)
    """An action not claimed this long after it was planned expires (never replayed late)."""
    max_attempts: int = Field(default=5, ge=1)
    """Leases that may run out on one action before it expires."""
    opt_out_nodes: list[str] = Field(default_factory=list)
    """Nodes no action ever targets (JSON list); PUT /v1/nodes/{node}/opt-out adds at runtime."""
    opt_out_jobs: list[str] = Field(default_factory=list)
    verify_failure_types: list[str] = Field(
        default_factory=lambda: [
            "nccl_timeout",
            "nccl_remote_error",
            "nccl_system_error",
            "nvlink_error",
            "ib_error",
        ]
    )
    """Failure types that, with no culprit node, plan a two-round node check before restarting."""
    claim_max_wait_s: float = Field(default=30.0, ge=0, le=30)
    """Caps a claim's `wait_seconds` (for proxies that cut idle requests sooner)."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """How often claim long polls, the action stream and the Redis relay look for changes."""
    base_url: str | None = None
    """The service's external URL, for the diagnosis link in notify actions."""


NotifyKind = Literal["generic", "slack", "pagerduty"]
NotifyAudience = Literal["user", "oncall"]
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class NotifyMatch(BaseModel):
    """Which `notify` actions a destination takes; an empty list matches anything."""

    model_config = ConfigDict(extra="forbid")

    families: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    audiences: list[NotifyAudience] = Field(default_factory=list)


class NotifyDestination(BaseModel):
    """One webhook. `url` is a secret too: a Slack webhook URL is its own credential."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    kind: NotifyKind = "generic"
    url: SecretStr | None = None
    """Required for generic and slack; pagerduty defaults to the Events v2 endpoint."""
    routing_key: SecretStr | None = None
    """PagerDuty integration key (required for pagerduty)."""
    match: NotifyMatch = NotifyMatch()

    @model_validator(mode="after")
    def _complete(self) -> NotifyDestination:
        if self.kind == "pagerduty":
            if self.routing_key is None or not self.routing_key.get_secret_value():
                raise ValueError(f"notify destination {self.name!r}: pagerduty needs routing_key")
            if self.url is None:
                self.url = SecretStr(PAGERDUTY_EVENTS_URL)
        if self.url is None:
            raise ValueError(f"notify destination {self.name!r}: {self.kind} needs url")
        parts = urlsplit(self.url.get_secret_value())
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"notify destination {self.name!r}: url must be http(s)://host/...")
        return self


class NotifySettings(BaseModel):
    """The webhook notifier of `notify` actions (diagnoser/actions/notifier.py, docs/notify.md)."""

    destinations: list[NotifyDestination] = Field(default_factory=list)
    """JSON list in `DIAGNOSER_NOTIFY__DESTINATIONS`; every matching destination gets the action."""
    default: str | None = None
    """Name of the destination that takes the actions no other destination's `match` selects
    (and only those)."""
    public_url: str | None = None
    """The service's URL as people reach it, for links (`{public_url}/v1/diagnoses/{id}`)."""
    request_timeout_s: float = Field(default=10.0, gt=0)
    deadline_s: float = Field(default=60.0, gt=0)
    """Total time one delivery (all destinations, every retry) may take."""
    max_attempts: int = Field(default=5, ge=1, le=20)
    backoff_base_s: float = Field(default=0.5, ge=0)
    backoff_max_s: float = Field(default=20.0, ge=0)
    lease_seconds: int = Field(default=120, ge=5, le=3600)
    """Lease the worker asks for; longer than `deadline_s`, so no other consumer takes it."""
    redact_patterns: list[str] = Field(default_factory=list)
    """Extra regexes removed from everything sent, besides the built-in secret patterns."""

    @field_validator("public_url")
    @classmethod
    def _no_trailing_slash(cls, url: str | None) -> str | None:
        """Links are built as `{public_url}/v1/...`; empty (as compose passes it) means unset."""
        if not url:
            return None
        return url.rstrip("/") or None

    @model_validator(mode="after")
    def _consistent(self) -> NotifySettings:
        names = [d.name for d in self.destinations]
        if len(set(names)) != len(names):
            raise ValueError("notify destination names must be unique")
        if self.default is not None and self.default not in names:
            raise ValueError(f"notify default {self.default!r} names no destination")
        if self.lease_seconds <= self.deadline_s:
            raise ValueError("notify lease_seconds must be longer than deadline_s")
        return self


class HangSettings(BaseModel):
    """No-progress ("hang") detection: see diagnoser/diagnosis/hang.py and docs/hangs.md."""

    timeout_s: float = Field(default=1800.0, gt=0)
    """A running job with no new step (or no line at all) for this long, and no error, is hung;
    jobs whose own steps are slower get three times their slowest recent step interval."""
    check_interval_s: float = Field(default=30.0, gt=0)
    """How often the service looks for stalled jobs."""
    action: Literal["restart_job", "escalate"] = "restart_job"
    """What a hang with no known cause recommends: a restart from the last checkpoint, or
    `escalate` to leave it to a person (docs/hangs.md)."""


class ReplicaSettings(BaseModel):
    """Several replicas on one PostgreSQL: see docs/scale-out.md."""

    id: str | None = Field(default=None, min_length=1, max_length=253)
    """This replica's name in job leases; default `<hostname>:<pid>` (the pod name in
    Kubernetes)."""
    lease_s: float = Field(default=10.0, ge=1.0, le=300.0)
    """A job's owner renews its lease every third of this; a survivor takes the job over this
    long after its owner died (a clean stop hands it over at once)."""


class SignalSettings(BaseModel):
    """Training signals read from progress lines: see docs/compression.md "Training signals"."""

    spike_factor: float = Field(default=1.5, gt=1.0)
    """A loss above this many times the rolling mean of the losses before it is a spike."""
    window: int = Field(default=20, ge=1)
    """Losses in the rolling mean."""
    min_window: int = Field(default=10, ge=1)
    """No spike is called before this many losses are in the mean."""

    def config(self) -> SignalConfig:
        from diagnoser.templates.signals import SignalConfig  # the settings stay light to import

        return SignalConfig(
            spike_factor=self.spike_factor, window=self.window, min_window=self.min_window
        )


class RetentionSettings(BaseModel):
    """Pruning of old job data: see diagnoser/store/retention.py and docs/retention.md.

    Ages count from a job's last activity (its last committed line or lifecycle event), so a
    job still streaming keeps everything. 0 keeps forever (the default: nothing is deleted
    until an operator chooses an age)."""

    days: float = Field(default=0.0, ge=0)
    """A job idle this long loses its kept lines, stream rows, events and compression counts;
    its row goes too once no diagnosis refers to it."""
    diagnosis_days: float = Field(default=0.0, ge=0)
    """Diagnoses (with their actions, culprits, feedback and escalations) of jobs idle past
    `days` go once not updated for this long; an action still pending or claimed holds its
    diagnosis. 0 keeps them forever; otherwise at least `days`."""
    batch_size: int = Field(default=1000, ge=1, le=50_000)
    """Rows one delete transaction removes at most (jobs looked at per step, too)."""
    interval_s: float = Field(default=3600.0, gt=0)
    """Time between passes; the first one runs this long after start, at most a minute."""
    pause_s: float = Field(default=0.05, ge=0)
    """Pause between two delete transactions, so ingest's writes go between them."""

    @model_validator(mode="after")
    def _diagnoses_outlive_lines(self) -> RetentionSettings:
        if self.diagnosis_days and not self.days:
            raise ValueError("retention diagnosis_days needs days (the lines go first)")
        if self.diagnosis_days and self.diagnosis_days < self.days:
            raise ValueError("retention diagnosis_days must be at least days")
        return self

    @property
    def enabled(self) -> bool:
        return self.days > 0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DIAGNOSER_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    log_level: str = "info"
    rules_dir: Path = Field(default_factory=default_rules_dir)
    """The rule pack (`rules/*.yaml`): validated at start, watched and hot-reloaded."""
    rules_watch: bool = True
    """Reload the pack when its files change (POST /v1/rules/reload works either way)."""
    gc_thresholds: tuple[int, int, int] = (1000, 10, 100)
    """`gc.set_threshold` for `serve`: allocations between young collections, young collections
    between middle ones, middle ones between full ones (Python's default is 700, 10, 10). The
    start-up heap is frozen either way (diagnoser/runtime.py)."""

    db: DbSettings = DbSettings()
    redis: RedisSettings = RedisSettings()
    llm: LlmSettings = LlmSettings()
    ingest: IngestSettings = IngestSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitSettings = LimitSettings()
    actions: ActionSettings = ActionSettings()
    hang: HangSettings = HangSettings()
    replica: ReplicaSettings = ReplicaSettings()
    signals: SignalSettings = SignalSettings()
    notify: NotifySettings = NotifySettings()
    retention: RetentionSettings = RetentionSettings()

    @field_validator("gc_thresholds")
    @classmethod
    def _positive_thresholds(cls, value: tuple[int, int, int]) -> tuple[int, int, int]:
        if min(value) < 1:
            raise ValueError("every garbage-collector threshold must be at least 1")
        return value

    @property
    def database_url(self) -> str:
        if self.db.url:
            return self.db.url
        return f"sqlite:///{(self.data_dir / SQLITE_FILE_NAME).resolve()}"
