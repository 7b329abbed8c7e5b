"""Settings: one object, built once at an entry point and passed down.

Every value comes from `DIAGNOSER_*` environment variables (nested groups use `__`, e.g.
`DIAGNOSER_DB__URL`) or from explicit keyword arguments, which tests use instead of env vars.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SQLITE_FILE_NAME = "diagnoser.db"
SOURCE_RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
"""The shipped pack in a source checkout; containers set DIAGNOSER_RULES_DIR instead."""


class DbSettings(BaseModel):
    url: str | None = None
    """SQLAlchemy URL; None means the embedded SQLite file in the data directory."""
    pool_size: int = Field(default=10, ge=1)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    echo: bool = False


class RedisSettings(BaseModel):
    url: str | None = None
    """Optional; without it everything runs in-process."""
    socket_timeout_s: float = Field(default=2.0, gt=0)


class LlmSettings(BaseModel):
    base_url: str | None = None
    """Any OpenAI-compatible endpoint; None disables the LLM stage."""
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=2, ge=0)

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


class AuthSettings(BaseModel):
    enabled: bool = False
    """Role-based bearer-token auth; off for the embedded single-user default."""


class ActionSettings(BaseModel):
    dry_run: bool = True
    """Recovery actions are recorded but not executed until an operator is configured."""


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
    rules_dir: Path = SOURCE_RULES_DIR
    """The rule pack (`rules/*.yaml`): validated at start, watched and hot-reloaded."""
    rules_watch: bool = True
    """Reload the pack when its files change (POST /v1/rules/reload works either way)."""

    db: DbSettings = DbSettings()
    redis: RedisSettings = RedisSettings()
    llm: LlmSettings = LlmSettings()
    ingest: IngestSettings = IngestSettings()
    auth: AuthSettings = AuthSettings()
    actions: ActionSettings = ActionSettings()
    hang: HangSettings = HangSettings()

    @property
    def database_url(self) -> str:
        if self.db.url:
            return self.db.url
        return f"sqlite:///{(self.data_dir / SQLITE_FILE_NAME).resolve()}"
